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

from collections.abc import Sequence

import numpy as np

from controller.metrics.registry import metric
from controller.metrics.tokenize import ngrams
from controller.metrics.unions import UnionItems, ngram_hashes, word_hashes

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


def distinct_items(docs: list[list[str]], groups: Sequence[Sequence[int]], n: int) -> UnionItems:
    """Each group's distinct n-grams (hashed, `controller.metrics.unions`) and its number of n-grams: distinct-n
    is |∪| / Σ, and the report takes from them its exact leave-one-out values and its paired swap test."""
    known: dict[str, int] = {}
    per_group, totals = [], []
    for members in groups:
        grams = [ngram_hashes(word_hashes(docs[i], known), n) for i in members]
        per_group.append(np.concatenate(grams) if grams else np.empty(0, dtype=np.uint64))
        totals.append(len(per_group[-1]))
    return UnionItems.of_groups(per_group, totals)


def _register(n: int) -> None:
    metric(
        f"distinct_{n}",
        description=f"Unique {n}-grams across the cell's generations / all their {n}-grams.",
        level="corpus",
        higher_is_better=True,
        interval="jackknife",  # a bootstrap's duplicated generations add no new n-gram
        citation=_LI,
        unit="fraction",
        union_items=lambda cell, groups: distinct_items(cell.words, groups, n),
        unit_interval=True,
        # distinct-3 on the skewed benchmark process, whose trigrams repeat almost only in the few looping prompts:
        # 91.3% and 91.7% at 16 and 32 prompts x 3 seeds, 94.2% at 64, 94.6% at 128 (docs/reports.md)
        calibrated_prompts=64 if n >= 3 else None,
    )(lambda cell: distinct_n(cell.words, n))


for _n in (1, 2, 3):
    _register(_n)
