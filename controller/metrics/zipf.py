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

from controller.metrics.registry import CellData, metric

TOP_N = 5000


def zipf_coefficient(docs: list[list[str]], top_n: int = TOP_N) -> float | None:
    """Negative least-squares slope of log frequency on log rank over the top `top_n` ranks."""
    counts = Counter(word for words in docs for word in words)
    freqs = sorted(counts.values(), reverse=True)[:top_n]
    if len(freqs) < 2:
        return None
    xs = [math.log(r) for r in range(1, len(freqs) + 1)]
    ys = [math.log(f) for f in freqs]
    x_mean = math.fsum(xs) / len(xs)
    y_mean = math.fsum(ys) / len(ys)
    sxy = math.fsum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys))
    sxx = math.fsum((x - x_mean) ** 2 for x in xs)
    slope = sxy / sxx
    return -slope if slope else 0.0  # no negative zero for a flat distribution


@metric(
    "zipf",
    description="Negative slope of log word frequency on log rank (top 5,000 ranks) over the cell's generations.",
    level="corpus",
    higher_is_better=None,
    interval="jackknife",  # a bootstrap's duplicated generations would distort the counts
    citation='Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", ICLR',
    unit="",
)
def zipf(cell: CellData) -> float | None:
    """Zipf coefficient of the cell; None with fewer than 2 distinct words."""
    return zipf_coefficient(cell.words)
