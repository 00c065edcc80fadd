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


def word_hashes(words: Sequence[str], known: dict[str, int]) -> np.ndarray:
    """64-bit hashes of `words` (BLAKE2b of the UTF-8 text), through `known`, a word's hash computed once."""
    out = np.empty(len(words), dtype=np.uint64)
    for i, w in enumerate(words):
        h = known.get(w)
        if h is None:
            h = known[w] = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
        out[i] = h
    return out


def _finish(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of the result depends on every bit of `h`."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def ngram_hashes(hashes: np.ndarray, n: int) -> np.ndarray:
    """The hashes of the n-grams of one generation, in order, from its words' hashes (empty if shorter than n)."""
    m = len(hashes) - n + 1
    if m <= 0:
        return np.empty(0, dtype=np.uint64)
    h = hashes[:m].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            h = _finish(h * _MIX + hashes[j : j + m])
    return h


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

    @classmethod
    def of_groups(cls, per_group: Sequence[np.ndarray], totals: Sequence[float]) -> UnionItems:
        """From each group's items (hashes, repeats allowed) and totals."""
        distinct = [np.unique(np.asarray(g, dtype=np.uint64)) for g in per_group]
        items = np.concatenate(distinct) if distinct else np.empty(0, dtype=np.uint64)
        return cls(items, np.array([len(d) for d in distinct], dtype=np.int64), np.asarray(totals, dtype=float))

    @property
    def groups(self) -> int:
        return len(self.sizes)

    def group_of_items(self) -> np.ndarray:
        return np.repeat(np.arange(self.groups), self.sizes)

    def take(self, idx: Sequence[int] | np.ndarray) -> UnionItems:
        """The groups `idx`, in that order."""
        idx = np.asarray(idx, dtype=np.intp)
        starts = np.concatenate([[0], np.cumsum(self.sizes)])
        parts = [self.items[starts[g] : starts[g + 1]] for g in idx]
        items = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
        return UnionItems(items, self.sizes[idx], self.totals[idx])

    def value(self) -> float:
        total = float(self.totals.sum())
        return len(np.unique(self.items)) / total if total > 0 else float("nan")

    def leave_one_out(self) -> np.ndarray:
        """The value without each group in turn (NaN where nothing counted is left), exactly: leaving group g out
        removes its totals and, from the distinct items, those that no other group has."""
        _, inverse, in_groups = np.unique(self.items, return_inverse=True, return_counts=True)
        only_here = np.bincount(self.group_of_items(), weights=in_groups[inverse] == 1, minlength=self.groups)
        rest = float(self.totals.sum()) - self.totals
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(rest > 0, (len(in_groups) - only_here) / rest, np.nan)
