"""A plain corpus metric is compared on each prompt's first generation where the cells' generations a prompt differ.

distinct-n, self-BLEU and Zipf are functions of a cell's whole set of generations, so their values move with how many
there are: distinct-n falls as a cell grows, and with 3 seeds a generation's self-BLEU has its own prompt's other two
generations among its references. A sampler of 3 seeds against greedy's 1 showed that as a difference, and the swap
tests could not run (a swap would change both cells' sizes). Now both cells' first generation of each prompt is
compared (`cellstats.matched`), and the report names the metrics so compared (`first_generation_diffs`, † in the
Markdown and HTML tables)."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest

from controller.metrics import METRICS
from controller.metrics.selfbleu import self_bleu
from controller.report.api import comparisons
from controller.report.compute.cells import CellOutput, from_json, to_json
from controller.report.render.comparisons import (
    FIRSTS,
    FIRSTS_NOTE,
    comparison_html,
    comparison_markdown,
    comparison_table,
)
from controller.report.render.format import column_format
from controller.report.stats.paired import FIRSTS_COLUMN, compare_pair
from tests.support.report import VOCAB, scored_cell

pytestmark = pytest.mark.pure

NAMES = ("distinct_2", "self_bleu_4", "mean_length")


def distinct_2(words: list[list[str]]) -> float:
    grams = [tuple(w[i : i + 2]) for w in words for i in range(len(w) - 1)]
    return len(set(grams)) / len(grams)


def texts(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(6, 14))) for _ in range(n)]


def cell(key: str, per_prompt: list[list[str]]):
    return scored_cell(key, per_prompt, NAMES)


def pair(G: int = 12, seed: int = 0):
    """A sampler of 3 generations a prompt whose first ones are greedy's exactly, the other two its own."""
    rng = random.Random(seed)
    firsts = texts(rng, G)
    sampler = [[first, *texts(rng, 2)] for first in firsts]
    return cell("sampler", sampler), cell("greedy", [[t] for t in firsts]), firsts


def test_a_corpus_metric_is_compared_on_each_prompts_first_generation():
    """The sampler's first generations are greedy's: no difference on distinct-2 and self-BLEU, p = 1. Before, the
    difference was of all 36 generations against 12 (distinct-2's size alone moving it) and self-BLEU's p the
    jackknife t-test's."""
    a, b, firsts = pair()
    out = compare_pair(a, b, {n: METRICS.get(n) for n in NAMES}, n_boot=200, rng=np.random.default_rng(0))
    assert out[FIRSTS_COLUMN] == "distinct_2 self_bleu_4"
    for name in ("distinct_2", "self_bleu_4"):
        assert out[f"{name}_diff"] == 0.0
        assert out[f"{name}_diff_p"] == 1.0
        assert out[f"{name}_diff_ci_low"] <= 0.0 <= out[f"{name}_diff_ci_high"]
    words = [t.split() for t in firsts]
    assert a.firsts.values["self_bleu_4"] == self_bleu(words) == b.values["self_bleu_4"]
    assert a.firsts.values["distinct_2"] == pytest.approx(distinct_2(words))
    # an additive metric is unchanged: a ratio of per-generation sums, its swaps per generation (`swaps.additive`)
    assert out["mean_length_diff"] == pytest.approx(a.values["mean_length"] - b.values["mean_length"])
    assert a.values["distinct_2"] != a.firsts.values["distinct_2"]  # the cell's own value stays on all 36


def test_a_difference_of_the_first_generations_is_found():
    """The sampler's first generations repeat one phrase: found on self-BLEU (an exact permutation p over 12
    prompts), the value being the first generations' difference."""
    rng = random.Random(3)
    greedy = [[t] for t in texts(rng, 12)]
    sampler = [["she was at the door and she was at the door", *texts(rng, 2)] for _ in range(12)]
    a, b = cell("sampler", sampler), cell("greedy", greedy)
    out = compare_pair(a, b, {n: METRICS.get(n) for n in NAMES}, n_boot=200, rng=np.random.default_rng(0))
    assert out["self_bleu_4_diff"] == pytest.approx(1.0 - b.values["self_bleu_4"])
    assert out["self_bleu_4_diff_p"] < 0.01


def test_cells_of_equal_generations_compare_as_they_are():
    rng = random.Random(4)
    a = cell("a", [texts(rng, 3) for _ in range(10)])
    b = cell("b", [texts(rng, 3) for _ in range(10)])
    out = compare_pair(a, b, {n: METRICS.get(n) for n in NAMES}, n_boot=100, rng=np.random.default_rng(0))
    assert out[FIRSTS_COLUMN] is None
    assert out["distinct_2_diff"] == a.values["distinct_2"] - b.values["distinct_2"]


def test_a_cell_without_its_first_generations_is_not_compared_on_all_of_them():
    """Statistics that kept no first generations (built by hand, or by code before them): no number, rather than the
    size-moved one."""
    a, b, _ = pair()
    a.firsts = None
    out = compare_pair(a, b, {n: METRICS.get(n) for n in NAMES}, n_boot=100, rng=np.random.default_rng(0))
    assert math.isnan(out["distinct_2_diff"]) and math.isnan(out["self_bleu_4_diff_p"])
    assert math.isfinite(out["mean_length_diff"])


def test_the_first_generations_survive_the_cache_and_a_forged_entry_is_refused():
    a, _, _ = pair()
    doc = to_json(CellOutput({"cell": "sampler"}, a))
    back = from_json(doc).stats
    assert back.firsts.values == a.firsts.values and back.firsts.generations == [1] * 12
    assert np.array_equal(back.firsts.kept["distinct_2"][1], a.firsts.kept["distinct_2"][1])
    nested = to_json(CellOutput({}, a))
    nested["stats"]["firsts"]["firsts"] = nested["stats"]["firsts"]  # deep nesting is refused before it is read
    other = to_json(CellOutput({}, a))
    other["stats"]["firsts"]["prompts"] = other["stats"]["firsts"]["prompts"][::-1]
    many = to_json(CellOutput({}, a))
    many["stats"]["firsts"]["generations"] = [3] * 12
    for forged in (nested, other, many):
        with pytest.raises(ValueError, match="first generations"):
            from_json(forged)


def test_the_tables_mark_what_was_compared_on_first_generations():
    a, b, _ = pair()
    out = compare_pair(a, b, {n: METRICS.get(n) for n in NAMES}, n_boot=100, rng=np.random.default_rng(0))
    rows = [{"cell": "greedy", "baseline": None}, {"cell": "sampler", "baseline": "greedy", **out}]
    for name in NAMES:
        rows[1][f"{name}_diff_p_holm"] = out[f"{name}_diff_p"]
    summary = pd.DataFrame(rows)
    table = comparison_table(summary, lambda v: f"{v:.3g}", lambda row: row["cell"], column_format)
    (_, header), (_, cells) = table
    marked = {h for h, v in zip(header, cells) if v.endswith(FIRSTS)}
    assert marked == {"Δ distinct_2", "Δ self_bleu_4"}
    assert FIRSTS_NOTE.strip() in "\n".join(comparison_markdown(table))
    assert "first generation" in comparison_html(table)
    long = comparisons(summary).set_index("metric").first_generations
    assert long["distinct_2"] and long["self_bleu_4"] and not long["mean_length"]
    rows[1][FIRSTS_COLUMN] = None
    plain = comparison_table(pd.DataFrame(rows), lambda v: f"{v:.3g}", lambda row: row["cell"], column_format)
    assert FIRSTS_NOTE.strip() not in "\n".join(comparison_markdown(plain))
