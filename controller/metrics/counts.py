"""A cell's word counts, prompt by prompt: Zipf's swap items.

The Zipf coefficient (controller.metrics.zipf) is a function of the cell's word counts alone, and a cell's word
counts with any prompts swapped between two cells are sums of each prompt's: so each prompt group keeps its distinct
words, as 64-bit hashes (controller.metrics.unions: BLAKE2b, the same in every process; two distinct words share
one with probability about U² / 2⁶⁵ among U of them), and how often its generations hold each. From them the report
recomputes the coefficient on any arrangement of swaps (controller.report.stats.swaps), for its paired permutation
test, which the leave-one-out values cannot give.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controller.metrics.unions import segments, sorted_within, word_hashes

TOP_N = 5000  # ranks of the Zipf fit (Holtzman et al.'s code, `--N 5000`)


@dataclass(frozen=True)
class CountItems:
    """Per prompt group: its distinct words as 64-bit hashes (`items`, group after group, `sizes[g]` of them, sorted;
    controller.metrics.unions) and how often the group's generations hold each (`counts`). A cell's word counts,
    and so its Zipf coefficient, with any prompts swapped between two cells are sums of these (controller.report.
    stats.swaps), which its leave-one-out values cannot give."""

    items: np.ndarray  # uint64
    counts: np.ndarray  # int64, one per item
    sizes: np.ndarray  # int64, one per group

    def __post_init__(self) -> None:
        counts, sizes = np.asarray(self.counts), np.asarray(self.sizes)
        if counts.shape != np.shape(self.items) or sizes.ndim != 1 or (sizes < 0).any():
            raise ValueError("count items: a count per item and a size per group are needed")
        if int(sizes.sum()) != len(self.items) or (counts < 1).any():
            raise ValueError("count items: the groups' sizes do not add up to the items, or a count is under 1")
        if not sorted_within(self.items, sizes):  # the swaps count on it
            raise ValueError("count items: a group's words are not distinct and sorted")

    @property
    def groups(self) -> int:
        return len(self.sizes)

    def group_of_items(self) -> np.ndarray:
        return np.repeat(np.arange(self.groups), self.sizes)

    @staticmethod
    def zipf(counts: np.ndarray, top_n: int = TOP_N) -> np.ndarray:
        """The Zipf coefficient (controller.metrics.zipf) of each row of word counts (K, V) (zeros: words the row
        lacks): its nonzero counts sorted, largest first, cut at `top_n`, the negative least-squares slope of their logs
        on the logs of their ranks; NaN where fewer than 2 ranks. The one fit: the metric's value, its leave-one-out
        values and its paired swap test's statistic all come from it."""
        counts = np.asarray(counts, dtype=float)
        width = min(counts.shape[1], top_n)
        if counts.shape[1] > width:  # only the top `width` counts enter: partitioned out, then sorted
            counts_top = -np.partition(-counts, width - 1, axis=1)[:, :width]
        else:
            counts_top = counts
        top = -np.sort(-counts_top, axis=1)
        n = np.minimum(np.count_nonzero(counts, axis=1), top_n)
        inside = np.arange(1, width + 1) <= n[:, None]
        x = np.log(np.arange(1, width + 1, dtype=float))
        y = np.where(inside, np.log(np.where(inside, top, 1.0)), 0.0)
        ranks = np.maximum(n, 1)
        dx = np.where(inside, x - (inside * x).sum(axis=1, keepdims=True) / ranks[:, None], 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            slope = (dx * (y - y.sum(axis=1, keepdims=True) / ranks[:, None])).sum(axis=1) / (dx * dx).sum(axis=1)
        return np.where(n >= 2, 0.0 - slope, np.nan)  # 0.0 − 0.0: no negative zero for a flat distribution

    def take(self, idx: Sequence[int] | np.ndarray) -> CountItems:
        """The groups `idx`, in that order."""
        idx = np.asarray(idx, dtype=np.intp)
        pick = segments(self.sizes, idx)
        return CountItems(self.items[pick], self.counts[pick], self.sizes[idx])


def count_items(docs: Sequence[Sequence[str]], groups: Sequence[Sequence[int]], limit: int | None = None):
    """Each group's distinct words of `docs` and their counts (`CountItems`); None where more than `limit`."""
    members = [i for group in groups for i in group]
    words = [w for i in members for w in docs[i]]
    group = np.repeat(np.arange(len(groups)), [sum(len(docs[i]) for i in g) for g in groups])
    hashes = word_hashes(words) if words else np.empty(0, dtype=np.uint64)
    order = np.lexsort((hashes, group))
    h, g = hashes[order], group[order]
    new = np.ones(len(h), dtype=bool)
    new[1:] = (h[1:] != h[:-1]) | (g[1:] != g[:-1])
    if limit is not None and int(new.sum()) > limit:
        return None
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(h)))
    return CountItems(h[starts], counts.astype(np.int64), np.bincount(g[starts], minlength=len(groups)))
