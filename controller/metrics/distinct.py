"""Distinct-n (Li et al. 2016): unique n-grams across the whole cell over all its n-grams.

    distinct-n = |∪_i set(n-grams of generation i)| / Σ_i |n-grams of generation i|

Corpus level: an n-gram that two generations share counts once in the numerator
(unlike rep-n, which only looks within each generation). N-grams never cross the
boundary between two generations. The denominator is the number of n-grams; Li et al.
wrote "divided by the total number of generated tokens", which for n > 1 differs by
n − 1 per generation; the n-gram count is what most implementations use and keeps the
value in [0, 1]. None when the cell has no n-gram (every generation shorter than n).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from controller.metrics.registry import metric
from controller.metrics.tokenize import ngrams

_LI = 'Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models", NAACL'


def distinct_n(docs: list[list[str]], n: int) -> float | None:
    """Unique n-grams across `docs` / total n-grams of `docs`; None if there are none."""
    seen: set[tuple[str, ...]] = set()
    total = 0
    for words in docs:
        grams = ngrams(words, n)
        seen.update(grams)
        total += len(grams)
    if total == 0:
        return None
    return len(seen) / total


def distinct_leave_one_out(docs: list[list[str]], groups: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """distinct-n of `docs` without each group in turn (NaN where no n-gram is left), exactly.

    Leaving group g out removes its n-grams from the total and, from the unique ones, those
    that no other group has: O(n-grams) for all groups, not one recomputation per group."""
    sets, totals = [], []
    for members in groups:
        grams = [g for i in members for g in ngrams(docs[i], n)]
        sets.append(set(grams))
        totals.append(len(grams))
    in_groups = Counter(g for s in sets for g in s)
    unique, total = len(in_groups), sum(totals)
    out = np.full(len(groups), np.nan)
    for k, (s, t) in enumerate(zip(sets, totals)):
        if total - t > 0:
            out[k] = (unique - sum(1 for g in s if in_groups[g] == 1)) / (total - t)
    return out


def _register(n: int) -> None:
    metric(
        f"distinct_{n}",
        description=f"Unique {n}-grams across the cell's generations / all their {n}-grams.",
        level="corpus",
        higher_is_better=True,
        interval="jackknife",  # a bootstrap's duplicated generations add no new n-gram
        citation=_LI,
        unit="fraction",
        leave_one_out=lambda cell, groups: distinct_leave_one_out(cell.words, groups, n),
        unit_interval=True,
        # distinct-3 on the skewed benchmark process, whose trigrams repeat almost only in the few looping prompts:
        # 91.3% and 91.7% at 16 and 32 prompts x 3 seeds, 94.2% at 64, 94.6% at 128 (docs/reports.md)
        calibrated_prompts=64 if n >= 3 else None,
    )(lambda cell: distinct_n(cell.words, n))


for _n in (1, 2, 3):
    _register(_n)
