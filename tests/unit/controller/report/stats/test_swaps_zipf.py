"""Zipf's paired test recomputes the coefficient on prompts swapped between the two cells (issue 46).

Its jackknife t-test rejected a true null in 2.5-4.6% of simulations at 16 and 32 prompts (docs/reports.md), as
distinct-1's had: the jackknife over-counts the interactions between prompts, and the coefficient is a fit of the
whole cell's word counts. A cell's counts with prompts swapped are sums of each prompt's (`CountItems`), so the
permutation test of the coefficient itself is exact under the null. Checked here against `zipf_coefficient` of the
swapped cells' words on every arrangement."""

from __future__ import annotations

import random

import numpy as np
import pytest

from controller.metrics import METRICS, CountItems
from controller.metrics.counts import count_items
from controller.metrics.zipf import zipf_coefficient, zipf_leave_one_out
from controller.report.stats import swaps
from tests.support.swaps import arranged, cached_and_damaged, groups_of, kept
from tests.support.swaps import heavy_tailed as docs

pytestmark = pytest.mark.pure

NAME = "zipf"


def test_the_statistic_is_zipf_of_the_swapped_cells():
    rng, draws = random.Random(1), np.random.default_rng(1)
    for _ in range(60):
        G, k = rng.randint(2, 7), rng.randint(1, 3)
        da, db = docs(rng, G * k, rng.randint(2, 60)), docs(rng, G * k, rng.randint(2, 60))
        statistic = swaps.zipf(count_items(da, groups_of(G, k)), count_items(db, groups_of(G, k)))
        masks = np.vstack([np.zeros(G, bool), draws.random((7, G)) < 0.5])
        for mask, got in zip(masks, statistic(masks)):
            x, y = arranged(da, db, mask, k)
            want = (zipf_coefficient(x) or np.nan) - (zipf_coefficient(y) or np.nan)
            assert got == pytest.approx(want, abs=1e-12, nan_ok=True)


def test_the_one_fit_is_least_squares_over_the_top_ranks():
    """`CountItems.zipf` against numpy's polyfit of the sorted counts, cut at top_n (the partitioned branch too)."""
    rng = np.random.default_rng(2)
    counts = rng.zipf(1.6, size=(5, 400)).astype(float) * (rng.random((5, 400)) < 0.7)
    for top_n in (5, 50, 5000):
        got = CountItems.zipf(counts, top_n)
        for row, value in zip(counts, got):
            top = np.sort(row[row > 0])[::-1][:top_n]
            slope = np.polyfit(np.log(np.arange(1, len(top) + 1)), np.log(top), 1)[0]
            assert value == pytest.approx(-slope, rel=1e-10)
    assert np.isnan(CountItems.zipf(np.array([[0.0, 3.0, 0.0]]))[0])  # one word: no line to fit
    assert CountItems.zipf(np.array([[2.0, 2.0, 2.0]]))[0] == 0.0  # flat, and not -0.0
    assert str(CountItems.zipf(np.array([[2.0, 2.0]]))[0]) == "0.0"


def test_the_leave_one_out_values_are_the_metric_without_each_prompt():
    rng = random.Random(3)
    da = docs(rng, 18, 40)
    loo = zipf_leave_one_out(da, groups_of(6, 3))
    for g in range(6):
        rest = [d for i, d in enumerate(da) if i // 3 != g]
        assert loo[g] == zipf_coefficient(rest)  # the same fit of the same counts: bit for bit


def stats(key: str, words: list[list[str]], G: int, k: int):
    return kept(NAME, zipf_coefficient, key, words, G, k)


def test_zipfs_counts_survive_the_cache_and_damaged_ones_are_refused():
    a = stats("a", docs(random.Random(4), 12, 30), 6, 2)
    damages = [
        (lambda e: e["counts"].__setitem__(0, 0), "under 1"),
        (lambda e: e["counts"].pop(), "not a cell's"),  # a count fewer than the words
        (lambda e: e["counts"].__setitem__(0, 2**70), "not a cell's"),  # past int64: no OverflowError
        (lambda e: e["counts"].__setitem__(0, "3"), "not a cell's"),
        (lambda e: e.__setitem__("sizes", [2] * 5), "not a cell's"),  # a cell of another prompt count
        (lambda e: e["sizes"].__setitem__(0, e["sizes"][0] + 1), "add up"),
    ]
    assert isinstance(cached_and_damaged(NAME, a, damages), CountItems)


def test_count_items_are_each_prompts_distinct_words_and_their_counts():
    items = count_items([["a", "b", "a"], ["b"], ["c"]], [[0, 1], [2]])
    assert items.sizes.tolist() == [2, 1] and items.counts[:2].tolist() == [2, 2] and items.counts[2] == 1
    assert count_items([["a", "b", "a"], ["b"], ["c"]], [[0, 1], [2]], limit=2) is None
    with pytest.raises(ValueError, match="distinct and sorted"):
        CountItems(np.array([2, 1], np.uint64), np.array([1, 1]), np.array([2]))
    assert METRICS.get(NAME).swap_items is not None
