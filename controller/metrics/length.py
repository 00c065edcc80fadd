"""Length and stopping: mean_length (words), mean_new_tokens (model tokens), eos_rate."""

from __future__ import annotations

from controller.metrics import CellData, metric


@metric(
    "mean_length",
    description="Mean generation length in words (the fixed word tokenizer), comparable across models.",
    level="corpus",
    higher_is_better=None,
    unit="words",
)
def mean_length(cell: CellData) -> float | None:
    """Σ_i |words_i| / N over the cell's N generations; None when the cell is empty.

    Words, not model tokens: subword vocabularies differ between models, the word
    tokenizer does not. An empty generation counts as length 0.
    """
    if not cell.words:
        return None
    return sum(len(w) for w in cell.words) / len(cell.words)


@metric(
    "mean_new_tokens",
    description="Mean number of new model tokens per generation (the model's own tokenizer).",
    level="corpus",
    higher_is_better=None,
    unit="tokens",
)
def mean_new_tokens(cell: CellData) -> float | None:
    """Σ_i n_new_tokens_i / N; None when token counts are absent (e.g. the reference row)."""
    if not cell.n_new_tokens or len(cell.n_new_tokens) != len(cell.texts):
        return None
    return sum(cell.n_new_tokens) / len(cell.n_new_tokens)


@metric(
    "eos_rate",
    description="Share of generations that stopped at the end-of-sequence token (not at max_new_tokens or a stop string).",
    level="corpus",
    higher_is_better=None,
    unit="fraction",
)
def eos_rate(cell: CellData) -> float | None:
    """#{i : stop_reason_i == "eos"} / N; None when stop reasons are absent (e.g. the reference row)."""
    if not cell.stop_reasons or len(cell.stop_reasons) != len(cell.texts):
        return None
    return sum(1 for r in cell.stop_reasons if r == "eos") / len(cell.stop_reasons)
