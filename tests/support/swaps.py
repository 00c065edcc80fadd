"""Cells for the swap tests of the plain corpus metrics (self-BLEU, Zipf): their generations arranged with prompts
swapped, what the report keeps of a cell, and a comparison's p over every arrangement."""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from controller.metrics import METRICS, cell_data
from controller.report.compute.cells import CellOutput, from_json, to_json
from controller.report.stats import intervals
from controller.report.stats.cellstats import CellStats
from controller.report.stats.paired import compare_pair, jackknife_t

Words = list[list[str]]
VOCAB = ["the", "a", "of", "and", "to", "in", "was", "she", "he", "it", "her", "his", "that", "with"]


def few_words(rng: random.Random, n: int, vocab: int, longest: int = 12) -> Words:
    """Short documents from the first `vocab` words of VOCAB (n-grams repeat, lengths tie), empty ones included."""
    return [[rng.choice(VOCAB[:vocab]) for _ in range(rng.randint(0, longest))] for _ in range(n)]


def heavy_tailed(rng: random.Random, n: int, vocab: int, longest: int = 30) -> Words:
    """Documents of words drawn from a heavy-tailed distribution over `vocab` words, empty ones included."""
    return [[f"w{min(int(rng.paretovariate(1.2)), vocab) - 1}" for _ in range(rng.randint(0, longest))]
            for _ in range(n)]  # fmt: skip


def groups_of(G: int, k: int) -> list[list[int]]:
    """G prompts of k generations each, laid prompt after prompt."""
    return [list(range(g * k, (g + 1) * k)) for g in range(G)]


def arranged(da: Words, db: Words, mask, k: int) -> tuple[Words, Words]:
    """The two cells' documents with the masked prompts' k generations exchanged."""
    x = [d for g, m in enumerate(mask) for d in (db if m else da)[g * k : (g + 1) * k]]
    y = [d for g, m in enumerate(mask) for d in (da if m else db)[g * k : (g + 1) * k]]
    return x, y


def kept(name: str, value: Callable[[Words], float], key: str, words: Words, G: int, k: int) -> CellStats:
    """What the report keeps of a cell for `name` (`intervals.jackknife`): its leave-one-out values and swap items."""
    data = cell_data([{"text": " ".join(w), "prompt_id": f"p{i // k}"} for i, w in enumerate(words)])
    keep, keep_items = {}, {}
    v = value(data.words)
    intervals.jackknife(METRICS.get(name), data, v, groups_of(G, k), keep=keep, keep_items=keep_items)
    return CellStats(key, "m", key, [f"p{g}" for g in range(G)], {name: v}, keep, keep_items, [k] * G)


def enumerated_p(value: Callable[[Words], float], da: Words, db: Words, G: int, k: int) -> float:
    """The two-sided permutation p of value(a) − value(b) over all 2^G arrangements of swapped prompts."""
    null = np.array([value(x) - value(y) for x, y in
                     (arranged(da, db, mask, k) for mask in itertools.product([False, True], repeat=G))])  # fmt: skip
    return float(np.mean(np.abs(null) >= abs(null[0]) * (1 - 1e-12)))


def p_of_pair(name: str, value: Callable[[Words], float], da: Words, db: Words, G: int, k: int) -> tuple[float, ...]:
    """For two cells of `name`: the report's paired p (`compare_pair`, 1,000 resamples: every arrangement where
    2^G is fewer), the p over every arrangement of the metric itself, and the jackknife t-test's (the old one)."""
    a, b = kept(name, value, "a", da, G, k), kept(name, value, "b", db, G, k)
    out = compare_pair(a, b, {name: METRICS.get(name)}, n_boot=1000, rng=np.random.default_rng(1))
    diff = a.values[name] - b.values[name]
    old = jackknife_t(a.kept[name][1], b.kept[name][1], diff, n_boot=1000, rng=np.random.default_rng(1))[2]
    return out[f"{name}_diff_p"], enumerated_p(value, da, db, G, k), old


def cached_and_damaged(name: str, cell: CellStats, damages: Sequence[tuple[Callable[[dict], Any], str]]):
    """`name`'s swap items of `cell` read back from the cache's JSON, equal to the kept ones (returned); and each
    (damage of their JSON entry, message) refused with that message."""
    doc = to_json(CellOutput({}, cell, {}, {}, []))
    u, v = cell.items[name], from_json(doc).stats.items[name]
    assert v.items.dtype == np.uint64
    assert all(np.array_equal(x, y) for x, y in ((u.items, v.items), (u.counts, v.counts), (u.sizes, v.sizes)))
    for damage, match in damages:
        broken = copy.deepcopy(doc)
        damage(broken["stats"]["items"][name])
        with pytest.raises(ValueError, match=match):
            from_json(broken)
    return v
