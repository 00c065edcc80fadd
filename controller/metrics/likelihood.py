"""Perplexity of the generations under the scoring model.

The worker scores each generation's new tokens with the scorer model (the generating
model unless the sweep names another) and records `nll_sum` (Σ −log p, natural log)
and `nll_count` (tokens scored). The cell's perplexity is token-weighted:

    perplexity = exp( Σ_i nll_sum_i / Σ_i nll_count_i )

not a mean of per-generation perplexities. None when any generation lacks its scores
(a partial value would silently change meaning), or no token was scored.
"""

from __future__ import annotations

import math

from controller.metrics import CellData, metric


@metric(
    "perplexity",
    description="exp(total token NLL / total tokens scored) of the generations under the scorer model.",
    level="corpus",
    higher_is_better=None,
    needs_model=True,
    citation="Jelinek et al. 1977; as a generation-quality signal: Holtzman et al. 2020, ICLR",
    unit="",
)
def perplexity(cell: CellData) -> float | None:
    """Token-weighted perplexity; None if scores are absent or no token was scored."""
    n = len(cell.texts)
    if n == 0 or len(cell.nll_sum) != n or len(cell.nll_count) != n:
        return None
    if any(s is None for s in cell.nll_sum) or any(c is None for c in cell.nll_count):
        return None
    tokens = sum(cell.nll_count)
    if tokens == 0:
        return None
    return math.exp(math.fsum(cell.nll_sum) / tokens)
