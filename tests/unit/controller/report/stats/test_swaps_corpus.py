"""The corpus metrics that recompute themselves on swapped prompts (self-BLEU from its n-gram occurrences, Zipf from
its word counts) get the exact permutation p of the metric itself, and fall back to the jackknife t-test where a cell
holds more items than are kept (issue 46). Their own swap statistics are checked in test_swaps_selfbleu.py and
test_swaps_zipf.py."""

from __future__ import annotations

import random

import pytest

from controller.metrics.selfbleu import self_bleu
from controller.metrics.zipf import zipf_coefficient
from controller.report.stats import intervals
from tests.support.swaps import few_words, heavy_tailed, kept, p_of_pair

pytestmark = pytest.mark.pure

# (metric, its value from words, documents, the two cells' vocabularies, a stream per k, the fallback's vocabulary);
# one cell of each pair writes from a smaller vocabulary (self-BLEU) or is more heavy-tailed (Zipf)
CASES = [
    ("self_bleu_4", self_bleu, few_words, (5, 14), 10, 14),
    ("zipf", zipf_coefficient, heavy_tailed, (8, 60), 20, 40),
]


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize(("name", "value", "docs", "vocab", "stream", "_"), CASES, ids=[c[0] for c in CASES])
def test_compare_pair_gives_the_exact_permutation_p_of_the_metric_itself(name, value, docs, vocab, stream, _, k):
    """9 prompts (512 arrangements, fewer than the 1,000 resamples: scipy enumerates them). The p is the
    enumeration's of the metric from the words; the old one, the jackknife t-test's, is not."""
    rng = random.Random(stream + k)
    G = 9
    da, db = docs(rng, G * k, vocab[0]), docs(rng, G * k, vocab[1])
    p, want, old = p_of_pair(name, value, da, db, G, k)
    assert p == pytest.approx(want)
    assert old != pytest.approx(want, abs=1e-3)  # the t-test's p (the old code's) is another number


@pytest.mark.parametrize(("name", "value", "docs", "_", "__", "vocab"), CASES, ids=[c[0] for c in CASES])
def test_a_cell_with_more_items_than_kept_falls_back_to_the_jackknife_t(name, value, docs, _, __, vocab, monkeypatch):
    monkeypatch.setattr(intervals, "MAX_KEPT_ITEMS", 10)
    a = kept(name, value, "a", docs(random.Random(5), 12, vocab), 12, 1)
    assert name in a.kept and a.items == {}
