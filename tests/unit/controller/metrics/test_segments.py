"""`unions.segments`, the one take of prompt groups' (or generations') items that the union, overlap and count
items share: the positions of the segments asked for, in the order asked."""

from __future__ import annotations

import numpy as np
import pytest

from controller.metrics.unions import UnionItems, segments

pytestmark = pytest.mark.pure


def test_segments_are_the_positions_of_the_groups_asked_for_in_that_order():
    rng = np.random.default_rng(0)
    for _ in range(500):
        sizes = rng.integers(0, 5, rng.integers(1, 12))
        idx = rng.integers(0, len(sizes), rng.integers(0, 15))  # repeats and any order, as a resample's
        starts = np.concatenate([[0], np.cumsum(sizes)])
        written_out = [p for g in idx for p in range(starts[g], starts[g + 1])]
        got = segments(sizes, idx)
        assert got.dtype == np.intp and got.tolist() == written_out
    assert segments(np.array([3, 2]), []).tolist() == []


def test_a_take_of_union_items_is_the_items_of_the_groups_taken():
    items = UnionItems.of_labelled(np.array([5, 7, 7, 9, 1, 5], dtype=np.uint64), np.array([0, 0, 1, 1, 2, 2]), 3)
    taken = items.take([2, 0])
    assert taken.items.tolist() == [1, 5, 5, 7] and taken.sizes.tolist() == [2, 2] and taken.totals.tolist() == [2, 2]
