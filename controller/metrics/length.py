"""Length and stopping: mean_length (words), mean_new_tokens (model tokens), eos_rate.

All three are means over the cell's generations, registered as additive metrics: each
generation contributes [value, 1] and the metric is Σ value / Σ 1.
"""

from __future__ import annotations

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.registry import additive_metric, item_rows, ratio


@additive_metric(
    "mean_length",
    combine=ratio,
    description="Mean generation length in words (the fixed word tokenizer), comparable across models.",
    level="corpus",
    higher_is_better=None,
    unit="words",
    bounds=(0, None),
)
def mean_length(cell: CellData) -> np.ndarray:
    """Per generation [|words_i|, 1]: the value is Σ_i |words_i| / N; None when the cell is empty.

    Words, not model tokens: subword vocabularies differ between models, the word
    tokenizer does not. An empty generation counts as length 0.
    """
    return item_rows([(len(w), 1) for w in cell.words], 2)


@additive_metric(
    "mean_new_tokens",
    combine=ratio,
    description="Mean number of new model tokens per generation (the model's own tokenizer).",
    level="corpus",
    higher_is_better=None,
    unit="tokens",
    bounds=(0, None),
)
def mean_new_tokens(cell: CellData) -> np.ndarray | None:
    """Per generation [n_new_tokens_i, 1]: Σ_i n_new_tokens_i / N.

    None when token counts are absent (e.g. the reference row).
    """
    if not cell.n_new_tokens or len(cell.n_new_tokens) != len(cell.texts):
        return None
    return item_rows([(n, 1) for n in cell.n_new_tokens], 2)


@additive_metric(
    "eos_rate",
    combine=ratio,
    description="Share of generations that stopped at the end-of-sequence token "
    "(not at max_new_tokens or a stop string).",
    level="corpus",
    higher_is_better=None,
    unit="fraction",
    unit_interval=True,
)
def eos_rate(cell: CellData) -> np.ndarray | None:
    """Per generation [stop_reason_i == "eos", 1]: #{i : eos} / N.

    None when stop reasons are absent (e.g. the reference row).
    """
    if not cell.stop_reasons or len(cell.stop_reasons) != len(cell.texts):
        return None
    return item_rows([(r == "eos", 1) for r in cell.stop_reasons], 2)
