"""Perplexity and coherence of the generations under the scoring model.

The worker scores each generation's new tokens with the scorer model (the generating
model unless the sweep names another) and records `nll_sum` (Σ −log p, natural log)
and `nll_count` (tokens scored: the stored token ids where the scorer shares the generating
model's tokenizer, a generated EOS included; see docs/metrics.md#perplexity). The cell's perplexity is token-weighted:

    perplexity = exp( Σ_i nll_sum_i / Σ_i nll_count_i )

not a mean of per-generation perplexities. None when any generation lacks its scores
(a partial value would silently change meaning), or no token was scored. Additive:
each generation contributes [nll_sum, nll_count].

Coherence (Su & Collier 2022, *Contrastive Search Is What You Need for Neural Text
Generation*) is the mean, over generations, of each continuation's mean token
log-likelihood given its prompt under the same scorer:

    coherence = (1/N) Σ_i ( −nll_sum_i / nll_count_i )

Additive: each generation contributes [−nll_sum_i / nll_count_i, 1] ([0, 0], left out of
the mean, when no token of it was scored); empty under the same conditions as perplexity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.registry import additive_metric, item_rows, ratio


def _perplexity(sums: Sequence[float]) -> float | None:
    """exp(Σ nll_sum / Σ nll_count); None when no token was scored; inf past the floats (a mean NLL over ~709.8 nats:
    a scorer that gave its tokens no probability), not an OverflowError that would lose the whole report."""
    nll, tokens = sums
    if tokens == 0:
        return None
    try:
        return math.exp(nll / tokens)
    except OverflowError:
        return math.inf


@additive_metric(
    "perplexity",
    combine=_perplexity,
    description="exp(total token NLL / total tokens scored) of the generations under the scorer model.",
    level="corpus",
    higher_is_better=None,
    needs_model=True,
    worker_computes="score",
    citation="Jelinek et al. 1977; as a generation-quality signal: Holtzman et al. 2020, ICLR",
    unit="",
    bounds=(1, None),  # exp of a mean NLL, which is at least 0
)
def perplexity(cell: CellData) -> np.ndarray | None:
    """Per generation [nll_sum_i, nll_count_i]; None for the whole cell if any generation lacks them."""
    scored = _scored(cell)
    return None if scored is None else item_rows(scored, 2)


def _scored(cell: CellData) -> list[tuple[float, int]] | None:
    """Every generation's (nll_sum, nll_count); None if the cell is empty or any generation lacks them."""
    n = len(cell.texts)
    if n == 0 or len(cell.nll_sum) != n or len(cell.nll_count) != n:
        return None
    if any(s is None for s in cell.nll_sum) or any(c is None for c in cell.nll_count):
        return None
    return list(zip(cell.nll_sum, cell.nll_count))


@additive_metric(
    "coherence",
    combine=ratio,
    description="Mean over generations of the mean token log-likelihood of the continuation given its prompt"
    " under the scorer model.",
    level="corpus",
    higher_is_better=True,
    needs_model=True,
    worker_computes="score",
    citation="Su & Collier 2022, arXiv:2210.14140",
    unit="nats/token",
    bounds=(None, 0),  # a mean log-likelihood
)
def coherence(cell: CellData) -> np.ndarray | None:
    """Per generation [−nll_sum_i / nll_count_i, 1] ([0, 0]: no token scored); None if any lacks its scores."""
    scored = _scored(cell)
    if scored is None:
        return None
    return item_rows([(-s / c, 1.0) if c else (0.0, 0.0) for s, c in scored], 2)
