"""What the metric tests share: the metric lists and small cell builders."""

from __future__ import annotations

from controller.metrics import METRICS, CellData, cell_data

SUMMARY_METRICS = [
    "mean_length", "rep_2", "rep_3", "rep_4", "diversity", "distinct_1", "distinct_2", "distinct_3",
    "self_bleu_4", "zipf", "perplexity", "bleu", "rouge_1", "rouge_2", "rouge_l",
]  # fmt: skip
ADDITIVE = [
    "bleu", "coherence", "diversity", "eos_rate", "mean_length", "mean_new_tokens", "perplexity", "rep_2", "rep_3",
    "rep_4", "rouge_1", "rouge_2", "rouge_l",
]  # fmt: skip
# additive, but read per prompt or only from a task's answers (tests/unit/controller/metrics/test_tasks.py checks them
# by hand)
TASK = ["answered", "distinct_answers", "exact_match"]
JACKKNIFE = ["distinct_1", "distinct_2", "distinct_3", "self_bleu_4", "zipf"]


def cell(*texts: str, **fields) -> CellData:
    """A cell from plain texts; `fields` are per-generation lists (reference=[...], ...)."""
    records = [{"text": t} for t in texts]
    for key, values in fields.items():
        for record, value in zip(records, values, strict=True):
            record[key] = value
    return cell_data(records)


def value(name: str, c: CellData) -> float | None:
    return METRICS.get(name).fn(c)
