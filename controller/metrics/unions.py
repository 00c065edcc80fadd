"""A union metric's cell, prompt by prompt: value = |∪ items| / Σ totals (distinct-n).

A metric whose value is the number of distinct things over the whole cell, divided by how many it
counted (distinct-n: distinct n-grams over n-grams), declares `union_items(cell, groups)`: each
prompt group's distinct items as 64-bit hashes and what the group counts in the denominator
(`UnionItems`). From them the report takes the value without each group exactly (`leave_one_out`,
the jackknife's) and, for a paired comparison, the value of two cells with any set of prompts swapped
between them (controller.report.stats.swaps), which the leave-one-out values alone cannot give.

Items are hashed, not kept as text, so that two cells' items compare and a cell's are small in the
report's cache: 64-bit hashes of words (BLAKE2b, the same in every process), n-grams combined from
them (`ngram_hashes`). Two distinct n-grams share a hash with probability about U² / 2⁶⁵ among U of
them (3 · 10⁻⁸ at a million).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_MIX = np.uint64(0x9E3779B97F4A7C15)  # the golden-ratio multiplier of Fibonacci hashing, odd


def word_hashes(words: Sequence[str]) -> np.ndarray:
    """64-bit hashes of `words` (BLAKE2b of the UTF-8 text), each distinct word hashed once."""
    position = {w: i for i, w in enumerate(dict.fromkeys(words))}
    table = np.array(
        [int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little") for w in position],
        dtype=np.uint64,
    )
    return table[np.array(list(map(position.__getitem__, words)), dtype=np.intp)]


def _finish(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of the result depends on every bit of `h`."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def mixed(h: np.ndarray, x: np.ndarray | np.uint64) -> np.ndarray:
    """One 64-bit hash of the pair (h, x): the n-grams' step, and an n-gram's k-th occurrence's (self-BLEU)."""
    with np.errstate(over="ignore"):
        return _finish(h * _MIX + x)


def ngram_hashes(hashes: np.ndarray, doc: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n-grams of documents laid end to end (`hashes`, the words' hashes; `doc`, each word's document, in
    runs): their hashes, in order, and their documents. No n-gram crosses from one document into the next."""
    m = len(hashes) - n + 1
    if m <= 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.intp)
    h = hashes[:m].copy()
    for j in range(1, n):
        h = mixed(h, hashes[j : j + m])
    inside = doc[:m] == doc[n - 1 :]
    return h[inside], doc[:m][inside]


def sorted_within(items: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether each segment of `items` (`sizes[i]` of them in turn) is strictly increasing: distinct and sorted."""
    if len(items) < 2:
        return True
    inside = np.ones(len(items) - 1, dtype=bool)
    ends = np.cumsum(sizes)[:-1]
    inside[ends[(ends > 0) & (ends < len(items))] - 1] = False
    return bool(np.all((items[1:] > items[:-1]) | ~inside))


def segments(sizes: np.ndarray, idx: Sequence[int] | np.ndarray) -> np.ndarray:
    """The positions of segments `idx`, in that order, of an array laid out as segments of `sizes` in turn (a take
    of prompt groups' items, or of generations' n-grams)."""
    sizes, idx = np.asarray(sizes, dtype=np.intp), np.asarray(idx, dtype=np.intp)
    starts, lengths = (np.cumsum(sizes) - sizes)[idx], sizes[idx]
    # each taken segment's start, repeated for its length, plus the position within it
    within = np.arange(int(lengths.sum()), dtype=np.intp) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + within


@dataclass(frozen=True)
class UnionItems:
    """Per prompt group: its distinct items (`items`, group after group, `sizes[g]` of them) and what it counts
    (`totals[g]`); the value is |∪ items| / Σ totals."""

    items: np.ndarray  # uint64
    sizes: np.ndarray  # int64, one per group
    totals: np.ndarray  # float64, one per group

    def __post_init__(self) -> None:
        sizes, totals = np.asarray(self.sizes), np.asarray(self.totals)
        if sizes.ndim != 1 or totals.shape != sizes.shape:
            raise ValueError("union items: sizes and totals need one entry per group")
        if (sizes < 0).any() or int(sizes.sum()) != len(self.items):
            raise ValueError("union items: the groups' sizes do not add up to the items")
        if not np.all(np.isfinite(totals) & (totals >= sizes)):
            raise ValueError("union items: a group counts fewer things than its distinct items")
        if not sorted_within(self.items, sizes):  # the value and the swaps count on it
            raise ValueError("union items: a group's items are not distinct and sorted")

    @classmethod
    def of_labelled(cls, items: np.ndarray, group: np.ndarray, groups: int) -> UnionItems:
        """From every item counted (hashes) and its group in [0, groups): each group's distinct items, and as its
        total the number it counted."""
        items, group = np.asarray(items, dtype=np.uint64), np.asarray(group, dtype=np.int64)
        totals = np.bincount(group, minlength=groups).astype(float)
        if not len(items):
            return cls(items, np.zeros(groups, dtype=np.int64), totals)
        # Sorts, no np.unique (numpy 2's hashes int64 keys: 6x slower here): each item's rank among the distinct
        # ones, then (group, rank) as one integer key, sorted, each pair kept once: group after group, items sorted
        order = np.argsort(items)
        ranked = items[order]
        new = np.empty(len(items), dtype=bool)
        new[0], new[1:] = True, ranked[1:] != ranked[:-1]
        distinct = ranked[new]
        rank = np.empty(len(items), dtype=np.int64)
        rank[order] = np.cumsum(new) - 1
        key = np.sort(group * len(distinct) + rank)
        key = key[np.concatenate([[True], key[1:] != key[:-1]])]
        g, r = np.divmod(key, len(distinct))
        return cls(distinct[r], np.bincount(g, minlength=groups).astype(np.int64), totals)

    @property
    def groups(self) -> int:
        return len(self.sizes)

    def group_of_items(self) -> np.ndarray:
        return np.repeat(np.arange(self.groups), self.sizes)

    def take(self, idx: Sequence[int] | np.ndarray) -> UnionItems:
        """The groups `idx`, in that order."""
        idx = np.asarray(idx, dtype=np.intp)
        return UnionItems(self.items[segments(self.sizes, idx)], self.sizes[idx], self.totals[idx])

    def value(self) -> float:
        total = float(self.totals.sum())
        if self.groups == 1:  # the whole cell as one group (the metric's value): its items are distinct already
            return len(self.items) / total if total > 0 else float("nan")
        ordered = np.sort(self.items)
        distinct = len(ordered) and 1 + int(np.count_nonzero(ordered[1:] != ordered[:-1]))
        return distinct / total if total > 0 else float("nan")

    def leave_one_out(self) -> np.ndarray:
        """The value without each group in turn (NaN where nothing counted is left), exactly: leaving group g out
        removes its totals and, from the distinct items, those that no other group has."""
        _, inverse, in_groups = np.unique(self.items, return_inverse=True, return_counts=True)
        only_here = np.bincount(self.group_of_items(), weights=in_groups[inverse] == 1, minlength=self.groups)
        rest = float(self.totals.sum()) - self.totals
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(rest > 0, (len(in_groups) - only_here) / rest, np.nan)
