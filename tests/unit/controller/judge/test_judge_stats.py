"""The judge's statistics on fixed verdicts: win rate, the length-controlled win rate by hand, calibration vs scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from controller.judge import stats

pytestmark = pytest.mark.pure


def rec(cell, pid, outcome, len_diff=0, seed=0, base="base", crit="overall"):
    return {"cell": cell, "baseline": base, "criterion": crit, "prompt_id": pid, "job_seed": seed,
            "outcome": outcome, "len_diff": len_diff}  # fmt: skip


def test_win_rate_counts_ties_half_and_leaves_unparsed_and_failed_out():
    records = [rec("v", "p0", "A"), rec("v", "p1", "A"), rec("v", "p2", "tie"), rec("v", "p3", "B"),
               rec("v", "p4", "unparsed"), rec("v", "p5", "failed")]  # fmt: skip
    (row,) = stats.pairwise_rows(records, n_boot=200)
    assert row["win_rate"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert (row["wins"], row["ties"], row["losses"], row["unparsed"], row["failed"]) == (2, 1, 1, 1, 1)
    assert 0 <= row["win_rate_ci_low"] <= row["win_rate"] <= row["win_rate_ci_high"] <= 1


def test_length_controlled_win_rate_matches_a_hand_computation():
    # Half the pairs with the variant longer by d, winning 8 of 10; half shorter by d, winning 5 of 10.
    # Δ/s = ±1, so x = ±tanh(1) and the two-parameter logistic model fits both groups exactly:
    # σ(β0 + β1 x) = 0.8, σ(β0 − β1 x) = 0.5  =>  β0 = (logit 0.8 + logit 0.5) / 2 = ln 2, LC = σ(ln 2) = 2/3.
    records = [rec("v", f"p{i}", "A" if i < 8 else "B", len_diff=30) for i in range(10)]
    records += [rec("v", f"q{i}", "A" if i < 5 else "B", len_diff=-30) for i in range(10)]
    (row,) = stats.pairwise_rows(records, n_boot=100)
    assert row["win_rate"] == pytest.approx(13 / 20)
    assert row["lc_win_rate"] == pytest.approx(2 / 3, abs=1e-6)
    assert row["lc_win_rate_ci_low"] < 2 / 3 < row["lc_win_rate_ci_high"]


def test_lc_with_ties_as_halves_and_without_length_variation():
    # no length variation: the model is the intercept only, LC = the raw win rate
    scores = np.array([1, 1, 0.5, 0])
    assert stats.lc_win_rate(scores, np.zeros(4)) == pytest.approx(0.625)
    # a longer answer winning everything and a shorter one losing: at zero difference, even
    scores = np.array([1.0, 1.0, 0.0, 0.0])
    assert stats.lc_win_rate(scores, np.array([10.0, 10.0, -10.0, -10.0])) == pytest.approx(0.5, abs=1e-3)


def test_single_grades_with_an_interval():
    records = [{"cell": "v", "criterion": "overall", "prompt_id": f"p{i}", "job_seed": 0, "grade": g,
                "outcome": "graded" if g else "unparsed"} for i, g in enumerate([4, 6, 8, None, 5])]  # fmt: skip
    (row,) = stats.single_rows(records, n_boot=200)
    assert row["grade"] == pytest.approx(23 / 4) and row["graded"] == 4 and row["unparsed"] == 1
    assert row["grade_ci_low"] < row["grade"] < row["grade_ci_high"]


def _key_and_sheets():
    items = {f"i{i}": {"cell": "v" if i < 6 else "base", "prompt_id": f"p{i % 6}", "job_seed": 0} for i in range(12)}
    r1 = {f"i{i}": {"overall": 1 + (i * 7) % 5} for i in range(12)}
    r2 = {f"i{i}": {"overall": 1 + (i * 3) % 5} for i in range(12)}
    return {"items": items, "criteria": ["overall"]}, {"r1": r1, "r2": r2}


def test_spearman_agreement_matches_scipy_on_fixed_data():
    key, sheets = _key_and_sheets()
    humans = stats.human_means(key, sheets)
    grades = [3, 9, 4, 7, 2, 8]
    records = [{"cell": "v", "criterion": "overall", "prompt_id": f"p{i}", "job_seed": 0, "grade": g}
               for i, g in enumerate(grades)]  # fmt: skip
    (row,) = stats.agreement(records, humans, "single", n_boot=200)
    means = [(sheets["r1"][f"i{i}"]["overall"] + sheets["r2"][f"i{i}"]["overall"]) / 2 for i in range(6)]
    assert row["value"] == pytest.approx(sps.spearmanr(grades, means).statistic)
    assert row["n"] == 6 and row["ci_low"] <= row["value"] <= row["ci_high"]


def test_pairwise_agreement_is_the_share_preferring_the_raters_choice():
    key, sheets = _key_and_sheets()
    humans = stats.human_means(key, sheets)
    outcomes = ["A", "B", "A", "B", "tie", "A"]
    records = [rec("v", f"p{i}", o) for i, o in enumerate(outcomes)]
    for r in records:
        r["baseline"] = "base"
    (row,) = stats.agreement(records, humans, "pairwise", n_boot=200)
    expect = []
    for i, o in enumerate(outcomes):
        mine, base = humans[("v", f"p{i}", 0)]["overall"], humans[("base", f"p{i}", 0)]["overall"]
        if o in ("A", "B") and mine != base:
            expect.append((o == "A") == (mine > base))
    assert row["n"] == len(expect) and row["value"] == pytest.approx(sum(expect) / len(expect))
    assert stats.spearman(np.array([[1, 2], [2, 2], [3, 2]])) is math.nan or math.isnan(
        stats.spearman(np.array([[1, 2], [2, 2], [3, 2]]))
    )
