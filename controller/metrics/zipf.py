"""Zipf coefficient of a cell's word frequencies (Holtzman et al. 2020).

Count every word (`word_tokenize`) over all the cell's generations, sort the counts in
decreasing order, keep the top N = 5,000 ranks (as in the paper's code, `--N 5000`),
and fit log f_r = a − s · log r by ordinary least squares over r = 1..min(V, N):

    s = − Σ_r (x_r − x̄)(y_r − ȳ) / Σ_r (x_r − x̄)²,   x_r = ln r,  y_r = ln f_r

The metric is s, the negative slope. Human English text is near 1; a larger s means
a few words dominate. Holtzman et al. counted the model's (GPT-2 BPE) tokens; we count
words so that models with different tokenizers compare. Only the counts enter, so
ties between words of equal frequency do not matter. None with fewer than 2 distinct
words (no line to fit).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.counts import TOP_N, CountItems, count_items
from controller.metrics.registry import metric


def zipf_coefficient(docs: list[list[str]], top_n: int = TOP_N) -> float | None:
    """Negative least-squares slope of log frequency on log rank over the top `top_n` ranks."""
    counts = Counter(word for words in docs for word in words)
    return _slope(Counter(counts.values()), top_n)


def _slope(histogram: Counter, top_n: int) -> float | None:
    """The coefficient from the counts' histogram (count -> how many words have it), by `CountItems.zipf`."""
    row = np.repeat([float(f) for f in histogram], [max(0, k) for k in histogram.values()])
    value = CountItems.zipf(row[None, :], top_n)[0] if len(row) else math.nan
    return None if math.isnan(value) else float(value)


def zipf_leave_one_out(docs: list[list[str]], groups: Sequence[Sequence[int]], top_n: int = TOP_N):
    """The Zipf coefficient without each group of documents in turn, exactly `zipf_coefficient`'s (NaN where
    fewer than 2 distinct words are left).

    Only the counts enter the fit, and only sorted: so the cell keeps how many words have each count, and
    leaving a group out moves just the group's words to their lower counts before the same fit (`_slope`).
    A group costs its own words and the cell's distinct counts, not a recount of the cell (which made the
    jackknife quadratic: 300 prompts × 3 seeds of 64 words took 6 s a cell)."""
    total = Counter(word for words in docs for word in words)
    histogram = Counter(total.values())
    out = np.full(len(groups), np.nan)
    for gi, members in enumerate(groups):
        left = histogram.copy()
        for word, c in Counter(word for i in members for word in docs[i]).items():
            f = total[word]
            left[f] -= 1
            if f > c:
                left[f - c] += 1
        value = _slope(left, top_n)
        if value is not None:
            out[gi] = value
    return out


@metric(
    "zipf",
    description="Negative slope of log word frequency on log rank (top 5,000 ranks) over the cell's generations.",
    level="corpus",
    higher_is_better=None,
    interval="jackknife",  # a bootstrap's duplicated generations would distort the counts
    leave_one_out=lambda cell, groups: zipf_leave_one_out(cell.words, groups),
    swap_items=lambda cell, groups, limit: count_items(cell.words, groups, limit),
    citation='Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", ICLR',
    unit="",
)
def zipf(cell: CellData) -> float | None:
    """Zipf coefficient of the cell; None with fewer than 2 distinct words."""
    return zipf_coefficient(cell.words)
