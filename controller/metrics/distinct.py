"""Distinct-n (Li et al. 2016): unique n-grams across the whole cell over all its n-grams.

    distinct-n = |∪_i set(n-grams of generation i)| / Σ_i |n-grams of generation i|

Corpus level: an n-gram that two generations share counts once in the numerator
(unlike rep-n, which only looks within each generation). N-grams never cross the
boundary between two generations. The denominator is the number of n-grams; Li et al.
wrote "divided by the total number of generated tokens", which for n > 1 differs by
n − 1 per generation; the n-gram count is what most implementations use and keeps the
value in [0, 1]. None when the cell has no n-gram (every generation shorter than n).

The n-grams are counted as 64-bit hashes (`controller.metrics.unions`: two distinct n-grams share one
with probability about U² / 2⁶⁵ among U of them), the same items the report's leave-one-out values and
paired swap test take, so that value, interval and test count one set.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from controller.metrics.registry import union_metric
from controller.metrics.unions import UnionItems, ngram_hashes, word_hashes

_LI = 'Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models", NAACL'


def distinct_items(docs: list[list[str]], groups: Sequence[Sequence[int]], n: int) -> UnionItems:
    """Each group's distinct n-grams (hashed, `controller.metrics.unions`) and its number of n-grams: distinct-n
    is |∪| / Σ, and the report takes from them its value, its exact leave-one-out values and its paired swap test.
    The documents are hashed laid end to end, in one pass (no n-gram crosses two of them)."""
    members = [i for group in groups for i in group]
    lengths = [len(docs[i]) for i in members]
    words = word_hashes([w for i in members for w in docs[i]])
    grams, doc = ngram_hashes(words, np.repeat(np.arange(len(members)), lengths), n)
    group_of_doc = np.repeat(np.arange(len(groups)), [len(group) for group in groups])
    return UnionItems.of_labelled(grams, group_of_doc[doc], len(groups))


def _register(n: int) -> None:
    union_metric(
        f"distinct_{n}",
        description=f"Unique {n}-grams across the cell's generations / all their {n}-grams.",
        higher_is_better=True,  # interval: the jackknife (a bootstrap's duplicated generations add no new n-gram)
        citation=_LI,
        unit="fraction",
        # distinct-3 on the skewed benchmark process, whose trigrams repeat almost only in the few looping prompts:
        # 91.3% and 91.7% at 16 and 32 prompts x 3 seeds, 94.2% at 64, 94.6% at 128 (docs/reports.md)
        calibrated_prompts=64 if n >= 3 else None,
    )(lambda cell, groups: distinct_items(cell.words, groups, n))


for _n in (1, 2, 3):
    _register(_n)
