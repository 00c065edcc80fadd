"""A comparisons table too small for Holm says so.

With G prompts a test that swaps the two cells' generations prompt by prompt has 2^G arrangements, so its p is at
least 2/2^G, and Holm multiplies the least p of the table by its number of p-values. The chat example (8 prompts,
72 p-values) could never show a difference at 0.05, however clear its intervals: every Holm p was 0.5625 and the
report did not say why. Now `floor_note` says so under the table (summary.md, report.html, `report --compare`)."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from controller.metrics import METRICS
from controller.report.compute.columns import PAIRED_COLUMN
from controller.report.render.comparisons import (
    comparison_html,
    comparison_markdown,
    comparison_table,
    floor_note,
)
from controller.report.render.format import column_format
from controller.report.stats.paired import compare_cells, least_p
from tests.support.report import VOCAB, scored_cell

pytestmark = pytest.mark.pure

NAMES = ("mean_length", "diversity", "rep_2")


def cell(key: str, G: int, length: int, seed: int):
    """A cell of G prompts, one generation each, `length` words long (and a word or two more)."""
    rng = random.Random(seed)
    return scored_cell(key, [[" ".join(rng.choice(VOCAB) for _ in range(length + g % 3))] for g in range(G)], NAMES)


def summary(G: int, cells: int = 4) -> pd.DataFrame:
    """A sweep's summary frame: a baseline and `cells` - 1 cells every prompt of which writes longer."""
    stats = [cell(f"c{i}", G, 6 + 4 * i, seed=i) for i in range(cells)]
    compared = compare_cells(stats, {n: METRICS.get(n) for n in NAMES}, baseline="c0", n_boot=200,
                             rng_for=lambda key: np.random.default_rng(0))  # fmt: skip
    return pd.DataFrame([{"cell": c.cell, "n_prompts": G, **compared[c.cell]} for c in stats])


def test_a_table_that_holm_keeps_below_the_level_says_why():
    frame = summary(6)
    p = frame["mean_length_diff_p"].dropna()
    assert (p == least_p(6)).all()  # every prompt longer: the least p a swap test can give
    holm = frame[[c for c in frame.columns if c.endswith("_p_holm")]].to_numpy(dtype=float)
    assert np.nanmin(holm) >= 0.05  # 9 p-values x 2/2^6: no difference can be found
    note = floor_note(frame)
    assert note.startswith("With 6 prompts no difference here can reach p < 0.05")
    assert "2/2^6 = 0.031" in note and "the table's 9 p-values" in note and "9 prompts or more" in note
    table = comparison_table(frame, lambda v: f"{v:.3g}", lambda row: row["cell"], column_format)
    assert note in "\n".join(comparison_markdown(table, note)) and "With 6 prompts" in comparison_html(table, note)
    assert "With 6 prompts" not in "\n".join(comparison_markdown(table))


def test_enough_prompts_lift_the_floor_and_the_note_goes():
    frame = summary(9)  # the number the note above asked for
    holm = frame[[c for c in frame.columns if c.endswith("_p_holm")]].to_numpy(dtype=float)
    assert np.nanmin(holm) < 0.05 and floor_note(frame) is None


@pytest.mark.parametrize("tests", [1, 3, 9, 72, 126, 1000, 12_345])
def test_the_prompts_it_asks_for_are_the_fewest_that_suffice(tests):
    frame = pd.DataFrame({"x_diff_p": [0.5] * tests, PAIRED_COLUMN: [2] * tests})
    note = floor_note(frame)
    needed = int(note.split(" prompts or more")[0].rsplit(" ", 1)[1])
    assert tests * least_p(needed) < 0.05 <= tests * least_p(needed - 1)
    assert floor_note(frame.assign(**{PAIRED_COLUMN: needed})) is None
    assert floor_note(frame.assign(**{PAIRED_COLUMN: needed - 1})) is not None


def test_a_mid_p_share_may_still_pass_and_the_note_says_so():
    frame = pd.DataFrame({"x_diff_p": [0.5] * 126, PAIRED_COLUMN: [12] * 126})  # the 12-prompt walk's table
    assert "no difference but a 0/1 share's here" in floor_note(frame)
    assert "no difference here" in floor_note(frame.assign(**{PAIRED_COLUMN: 8}))


def test_no_p_values_or_no_paired_prompts_no_note():
    assert floor_note(pd.DataFrame({"x_diff_p": [np.nan] * 3, PAIRED_COLUMN: [4] * 3})) is None
    assert floor_note(pd.DataFrame({"x_diff_p": [0.5] * 3, PAIRED_COLUMN: [np.nan] * 3})) is None
    assert floor_note(pd.DataFrame({"x_diff_p": [0.5]})) is None
    # a sweep's baselines (no baseline of their own) and the reference row count for nothing
    rows = [
        {"cell": "a", "n_prompts": 40, "baseline": None},
        {"cell": np.nan, "n_prompts": 40, "baseline": np.nan},
        {"cell": "b", "n_prompts": 5, "baseline": "a", "x_diff_p": 0.5},
    ]
    assert "With 5 prompts" in floor_note(pd.DataFrame(rows))
