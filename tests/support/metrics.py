"""What the metric tests share: the metric lists, small cell builders, one cell's interval as the report draws it."""

from __future__ import annotations

import numpy as np

from controller.metrics import METRICS, CellData, cell_data
from controller.report.stats.intervals import confidence_intervals, evaluate, prompt_groups

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


def looping_cell(G: int = 32) -> CellData:
    """G prompts of one generation: most of 30 words from a large vocabulary, three of them looping on a bigram."""
    rng = np.random.default_rng(5)
    words = [[f"w{w}" for w in rng.zipf(1.3, 30) % 5000] for _ in range(G)]
    for g in range(3):
        words[g] = ["again", "and"] * 15
    return CellData(texts=[" ".join(w) for w in words], words=words)


def one_interval(name: str, metric, cell: CellData, G: int) -> tuple[dict, tuple]:
    """The metric's value and its (low, high, method) on a cell of G prompts of one generation each, in order."""
    values = evaluate([(name, metric)], cell)
    groups = prompt_groups([f"p{g}" for g in range(G)])
    rng = np.random.default_rng(0)
    (interval,) = confidence_intervals([(name, metric)], cell, values, groups, n_boot=2000, n_boot_corpus=20,
                                         rng=rng).values()  # fmt: skip
    return values, interval


def distinct_2(docs: list[list[str]]) -> float:
    """distinct-2 counted here, not by controller.metrics: unique bigrams over bigrams, within each document."""
    grams = [tuple(d[i : i + 2]) for d in docs for i in range(len(d) - 1)]
    return len(set(grams)) / len(grams)
