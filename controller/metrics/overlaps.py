"""A cell's generations as the n-gram occurrences they hold (self-BLEU's clipped counts), prompt by prompt.

Self-BLEU scores each generation h against every other generation of the cell: its clipped count of order n is
Σ_g min(c_h(g), max_{r≠h} c_r(g)) over h's n-grams g. Write each occurrence as an item (g, k), h's k-th g for
k = 1..c_h(g): then min(c_h(g), max_{r≠h} c_r(g)) = #{k ≤ c_h(g) : some r ≠ h holds (g, k)}, so the clipped count
is the number of h's items of order n that another generation of the cell holds too. A generation holds as many
items of order n as it has n-grams, so its length and its BLEU's denominators come from the items as well. From
them the report recomputes self-BLEU on any arrangement of prompts swapped between two cells
(controller.report.stats.swaps), for its paired permutation test, which its leave-one-out values cannot give.

Items are 64-bit hashes (controller.metrics.unions; an occurrence's from its n-gram's hash, its k and its n): two
distinct occurrences share one with probability about U² / 2⁶⁵ among U of them (3 · 10⁻⁸ at a million).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controller.metrics.unions import mixed, ngram_hashes, segments, sorted_within, word_hashes

EPSILON = 0.1  # NLTK SmoothingFunction().method1 default


@dataclass(frozen=True)
class OverlapItems:
    """Each generation's n-gram occurrences of orders 1..max_n as items (`items`: generation after generation, order
    after order, each generation's items of one order distinct and sorted; `counts[i, n - 1]` of them, its n-grams),
    the generations laid prompt group after prompt group (`sizes[g]` generations in group g)."""

    items: np.ndarray  # uint64
    counts: np.ndarray  # int64, (generations, max_n)
    sizes: np.ndarray  # int64, one per group

    def __post_init__(self) -> None:
        counts, sizes = np.asarray(self.counts), np.asarray(self.sizes)
        if counts.ndim != 2 or counts.shape[1] < 1 or sizes.ndim != 1:
            raise ValueError("overlap items: counts need a row per generation, sizes an entry per group")
        if (sizes < 0).any() or int(sizes.sum()) != len(counts):
            raise ValueError("overlap items: the groups' sizes do not add up to the generations")
        if (counts < 0).any() or int(counts.sum()) != len(self.items):
            raise ValueError("overlap items: the counts do not add up to the items")
        if not np.array_equal(counts, np.maximum(0, counts[:, :1] - np.arange(counts.shape[1]))):
            raise ValueError("overlap items: a generation's n-grams do not follow from its length")
        if not sorted_within(self.items, counts.ravel()):  # the swaps count on it
            raise ValueError("overlap items: a generation's items are not distinct and sorted")

    @property
    def groups(self) -> int:
        return len(self.sizes)

    @property
    def max_n(self) -> int:
        return int(self.counts.shape[1])

    @property
    def lengths(self) -> np.ndarray:
        """Each generation's words (its unigrams)."""
        return self.counts[:, 0]

    @staticmethod
    def scores(clipped: np.ndarray, totals: np.ndarray, hyp_len: np.ndarray, ref_len: np.ndarray) -> np.ndarray:
        """Each generation's self-BLEU score, `selfbleu._score` of arrays: NLTK's sentence BLEU (method1, weights
        1/max_n) from the clipped counts and n-gram totals (..., max_n), the hypothesis and closest reference lengths
        (...); equal to `_score` but for the order of one sum (within a few ulps)."""
        den = np.maximum(1, totals)
        logs = np.log(np.where(clipped > 0, clipped, EPSILON) / den).sum(axis=-1) / clipped.shape[-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            bp = np.where(hyp_len > ref_len, 1.0, np.where(hyp_len == 0, 0.0, np.exp(1 - ref_len / hyp_len)))
        return np.where(clipped[..., 0] > 0, bp * np.exp(logs), 0.0)

    def group_of_generations(self) -> np.ndarray:
        return np.repeat(np.arange(self.groups), self.sizes)

    def take(self, idx: Sequence[int] | np.ndarray) -> OverlapItems:
        """The groups `idx`, in that order."""
        idx = np.asarray(idx, dtype=np.intp)
        gens = segments(self.sizes, idx)
        items = self.items[segments(self.counts.sum(axis=1), gens)]
        return OverlapItems(items, self.counts[gens], self.sizes[idx])


def overlap_items(
    docs: Sequence[Sequence[str]], groups: Sequence[Sequence[int]], max_n: int, limit: int | None = None
) -> OverlapItems | None:
    """The n-gram occurrences of orders 1..max_n of `docs`, grouped as `groups` (each group's documents in turn);
    None where they would be more than `limit`, or where two of one generation's share a hash."""
    members = [i for group in groups for i in group]
    lengths = np.array([len(docs[i]) for i in members], dtype=np.int64)
    counts = np.maximum(0, lengths[:, None] - np.arange(max_n))
    sizes = np.array([len(group) for group in groups], dtype=np.int64)
    if limit is not None and int(counts.sum()) > limit:
        return None
    words = word_hashes([w for i in members for w in docs[i]])
    doc_of_word = np.repeat(np.arange(len(members)), lengths)
    items, docs_of, orders = [], [], []
    for n in range(1, max_n + 1):
        h, d = ngram_hashes(words, doc_of_word, n)
        order = np.lexsort((h, d))
        h, d = h[order], d[order]
        new = np.ones(len(h), dtype=bool)
        new[1:] = (h[1:] != h[:-1]) | (d[1:] != d[:-1])
        at = np.arange(len(h))
        k = at - np.maximum.accumulate(np.where(new, at, 0))  # its occurrence in its generation: 0, 1, ...
        items.append(mixed(mixed(h, k.astype(np.uint64)), np.uint64(n)))
        docs_of.append(d)
        orders.append(np.full(len(h), n, dtype=np.int64))
    item, doc, n_of = (np.concatenate(x) for x in (items, docs_of, orders))
    layout = np.lexsort((item, n_of, doc))
    item, segment = item[layout], (doc * max_n + n_of - 1)[layout]
    if np.any((item[1:] == item[:-1]) & (segment[1:] == segment[:-1])):
        return None  # a 64-bit collision inside one generation: no swap test rather than a wrong one
    return OverlapItems(item, counts, sizes)
