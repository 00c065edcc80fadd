"""Repetition within generations: rep-2, rep-3, rep-4 and diversity (Su et al. 2022).

    rep-n     = 1 − Σ_i |unique n-grams of generation i| / Σ_i |n-grams of generation i|
    diversity = Π_{n=2..4} (1 − rep-n)

as in SimCTG's `measure_repetition_and_diversity` (Su et al. 2022, "A Contrastive
Framework for Neural Text Generation"; rep-n after Welleck et al. 2019, "Neural Text
Generation with Unlikelihood Training"). Uniqueness is within each generation: an
n-gram repeated across two generations is not a repetition. Deviations from the
SimCTG code, all deliberate:

- tokens come from `word_tokenize` (SimCTG splits on white space);
- every n-gram counts: a generation of L words has L − n + 1 n-grams (SimCTG's loop
  `while end_idx < len(token_list)` drops the last one);
- values are fractions in [0, 1], not rounded (SimCTG rounds rep-n to two decimals of
  a percentage before taking the product).

rep-n is None when the cell has no n-gram at all (every generation shorter than n
words); diversity is None when any of its rep-n is. All four are additive: each
generation contributes its [unique, total] n-gram counts, and the value combines the
cell's sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.registry import additive_metric, item_rows
from controller.metrics.tokenize import ngrams

_SU = 'Su et al. 2022, "A Contrastive Framework for Neural Text Generation" (SimCTG), NeurIPS'
_WELLECK = 'Welleck et al. 2020, "Neural Text Generation with Unlikelihood Training", ICLR'


def ngram_stats(cell: CellData, ns: Sequence[int]) -> np.ndarray:
    """Per generation, for each n in `ns`: [unique n-grams, n-grams] (2 · len(ns) columns)."""
    rows = []
    for words in cell.words:
        row: list[int] = []
        for n in ns:
            grams = ngrams(words, n)
            row += [len(set(grams)), len(grams)]
        rows.append(row)
    return item_rows(rows, 2 * len(ns))


def repetition(unique: float, total: float) -> float | None:
    """rep-n from the cell's summed counts: 1 − unique / total; None without n-grams."""
    if total == 0:
        return None
    return 1.0 - unique / total


def _diversity(sums: Sequence[float]) -> float | None:
    """Π_{n=2..4} (1 − rep-n) from [u2, t2, u3, t3, u4, t4]; None when any rep-n is None."""
    product = 1.0
    for i in (0, 2, 4):
        rep = repetition(sums[i], sums[i + 1])
        if rep is None:
            return None
        product *= 1.0 - rep
    return product


def _register(n: int) -> None:
    additive_metric(
        f"rep_{n}",
        combine=lambda sums: repetition(sums[0], sums[1]),
        description=f"Share of {n}-grams that repeat an earlier {n}-gram of the same generation "
        "(pooled over the cell).",
        level="corpus",
        higher_is_better=False,
        citation=f"{_WELLECK}; {_SU}",
        unit="fraction",
        unit_interval=True,
    )(lambda cell: ngram_stats(cell, (n,)))


for _n in (2, 3, 4):
    _register(_n)


@additive_metric(
    "diversity",
    combine=_diversity,
    description="(1 − rep-2)(1 − rep-3)(1 − rep-4): 1 when no generation repeats itself.",
    level="corpus",
    higher_is_better=True,
    citation=_SU,
    unit="fraction",
    unit_interval=True,
)
def diversity(cell: CellData) -> np.ndarray:
    """Per generation [unique, total] 2-, 3- and 4-grams; the value is Π_n (1 − rep-n)."""
    return ngram_stats(cell, (2, 3, 4))
