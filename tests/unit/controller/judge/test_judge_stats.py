"""The judge's statistics on fixed verdicts: win rate, the length-controlled win rate by hand, calibration vs scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from controller.judge import stats

pytestmark = pytest.mark.pure


def rec(cell, pid, outcome, len_diff=0, seed=0, base="base", crit="overall", sample=0):
    return {"cell": cell, "baseline": base, "criterion": crit, "prompt_id": pid, "job_seed": seed, "sample": sample,
            "outcome": outcome, "len_diff": len_diff, "baseline_job_seed": seed, "baseline_sample": 0}  # fmt: skip


def test_win_rate_counts_ties_half_and_leaves_unparsed_and_failed_out():
    records = [rec("v", "p0", "A"), rec("v", "p1", "A"), rec("v", "p2", "tie"), rec("v", "p3", "B"),
               rec("v", "p4", "unparsed"), rec("v", "p5", "failed")]  # fmt: skip
    (row,) = stats.pairwise_rows(records, n_boot=200)
    assert row["win_rate"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert (row["wins"], row["ties"], row["losses"], row["unparsed"], row["failed"]) == (2, 1, 1, 1, 1)
    assert row["prompts"] == 4 and math.isnan(row["win_rate_ci_low"])  # fewer than the report's 8 prompts
    (row,) = stats.pairwise_rows(records + [{**r, "prompt_id": r["prompt_id"] + "b"} for r in records], n_boot=200)
    assert row["prompts"] == 8 and 0 <= row["win_rate_ci_low"] <= row["win_rate"] <= row["win_rate_ci_high"] <= 1


def test_no_judge_interval_from_fewer_prompts_than_the_report_needs():
    """With 2 or 3 prompts the win rate, the LC win rate, the grade and Spearman's ρ had bootstrap intervals (a
    resample of 3 prompts draws one prompt alone 1 time in 9: a percentile interval of such draws means nothing).
    Now every judge interval needs the report's 8 prompts, as the report's own do, and the section says so."""
    import pandas as pd

    from controller.judge.report import judge_markdown

    lengths = [30, -20, 10, 25, -5, 40, -30, 15, 20]
    outcomes = ["A", "B", "A", "tie", "A", "B", "B", "A", "A"]
    pairs = [rec("v", f"p{i % 3}", o, len_diff=d, seed=i // 3) for i, (o, d) in enumerate(zip(outcomes, lengths))]
    (row,) = stats.pairwise_rows(pairs, n_boot=200)
    assert row["prompts"] == 3 and not math.isnan(row["win_rate"]) and not math.isnan(row["lc_win_rate"])
    assert all(math.isnan(row[k]) for k in ("win_rate_ci_low", "win_rate_ci_high", "lc_win_rate_ci_low"))
    graded = [{"cell": "v", "criterion": "overall", "prompt_id": f"p{i % 3}", "job_seed": i // 3, "grade": g,
               "outcome": "graded"} for i, g in enumerate([4, 6, 8, 5, 7, 3])]  # fmt: skip
    (grade,) = stats.single_rows(graded, n_boot=200)
    assert math.isnan(grade["grade_ci_low"]) and grade["prompts"] == 3
    key, sheets = _key_and_sheets(3)
    rho = stats.agreement([{**g, "sample": 0} for g in graded[:3]], stats.human_means(key, sheets), "single", 200)
    assert math.isnan(rho[0]["ci_low"])
    summary = pd.DataFrame({"cell": ["v"], "strategy": ["top_k"]})
    summary.attrs["judge"] = {"mode": "pairwise", "judge": "j", "template": "t", "template_sha256": "0" * 64,
                              "rows": [row], "agreement": []}  # fmt: skip
    assert "No interval where fewer than 8 prompts were judged (here as few as 3)." in "\n".join(
        judge_markdown(summary)
    )


def test_length_controlled_win_rate_matches_a_hand_computation():
    # Half the pairs with the variant longer by d, winning 40 of 50; half shorter by d, winning 25 of 50.
    # Δ/s = ±1, so x = ±tanh(1) and the two-parameter logistic model fits both groups exactly:
    # σ(β0 + β1 x) = 0.8, σ(β0 − β1 x) = 0.5  =>  β0 = (logit 0.8 + logit 0.5) / 2 = ln 2, LC = σ(ln 2) = 2/3.
    # (50 a side, not 10: a resample of 10 longer ones all won, length separating it, is drawn one time in nine)
    records = _two_groups()
    (row,) = stats.pairwise_rows(records, n_boot=100)
    assert row["win_rate"] == pytest.approx(65 / 100)
    assert row["lc_win_rate"] == pytest.approx(2 / 3, abs=1e-6)
    assert row["lc_win_rate_ci_low"] < 2 / 3 < row["lc_win_rate_ci_high"]


def _two_groups(n: int = 50) -> list[dict]:
    records = [rec("v", f"p{i}", "A" if i < 0.8 * n else "B", len_diff=30) for i in range(n)]
    return records + [rec("v", f"q{i}", "A" if i < 0.5 * n else "B", len_diff=-30) for i in range(n)]


def test_lc_with_ties_as_halves_and_without_length_variation():
    # no length variation: the model is the intercept only, LC = the raw win rate
    scores = np.array([1, 1, 0.5, 0])
    assert stats.lc_win_rate(scores, np.zeros(4)) == pytest.approx(0.625)
    # a longer answer winning everything and a shorter one losing: length separates the verdicts, no fit exists
    # (before: 0.5, where the symmetric data happened to hold the drifting fit)
    scores = np.array([1.0, 1.0, 0.0, 0.0])
    assert stats.lc_fit(scores, np.array([10.0, 10.0, -10.0, -10.0])) == (pytest.approx(math.nan, nan_ok=True),
                                                                          stats.LC_SEPARATED)  # fmt: skip


# the reviewer's example: twelve pairs, every longer answer winning, every shorter one losing
SEPARATED = np.array([9, 10, -7, 10, 8, 13, -3, 18, 2, 12, -8, 8], dtype=float)


def test_lc_is_not_estimable_where_length_separates_the_verdicts_whatever_the_steps():
    # before: 0.949 here, and 0.051 with a loss moved from -3 to -2 and a win from 2 to 3 (the fit's slope runs off
    # to infinity and σ(β₀) followed the number of Newton steps)
    moved = SEPARATED.copy()
    moved[[6, 8]] = [-2, 3]
    for diff in (SEPARATED, moved, -SEPARATED):
        for steps in (20, 50, 200):
            value, why = stats.lc_fit((SEPARATED > 0) * 1.0, diff, steps)
            assert math.isnan(value) and why == stats.LC_SEPARATED
    # quasi-complete: a tie (half a win, half a loss) at the boundary length, the others apart, separates too
    scores = np.array([0.0, 0.0, 0.5, 1.0, 1.0])
    assert stats.lc_fit(scores, np.array([-5.0, -3.0, 0.0, 3.0, 5.0]))[1] == stats.LC_SEPARATED
    # one loss among the longer answers: the sets overlap, the fit exists (scipy's maximum likelihood)
    scores = (SEPARATED > 0) * 1.0
    scores[7] = 0.0
    value, why = stats.lc_fit(scores, SEPARATED)
    x = np.tanh(SEPARATED / SEPARATED.std())
    mle = sps.logistic.cdf(_mle(scores, x)[0])
    assert why is None and value == pytest.approx(mle, abs=1e-6)


def _mle(scores: np.ndarray, x: np.ndarray) -> np.ndarray:
    from scipy.optimize import minimize

    def nll(b):
        z = b[0] + b[1] * x
        return float(np.sum(np.logaddexp(0, z) - scores * z))

    return minimize(nll, np.zeros(2), method="BFGS", options={"gtol": 1e-10}).x


def test_a_separated_judge_row_says_why_its_lc_is_missing_and_the_report_shows_it():
    import pandas as pd

    from controller.judge.report import add_judge, judge_markdown

    records = [rec("m::v", f"p{i}", "A" if d > 0 else "B", len_diff=int(d)) for i, d in enumerate(SEPARATED)]
    (row,) = stats.pairwise_rows(records, n_boot=200)
    assert row["win_rate"] == pytest.approx(9 / 12)
    assert math.isnan(row["lc_win_rate"]) and math.isnan(row["lc_win_rate_ci_low"])
    assert row["lc_note"] == stats.LC_SEPARATED
    summary = pd.DataFrame([{"cell": "m::v", "strategy": "v"}])
    doc = {"mode": "pairwise", "rows": [row], "judge": "j", "template": "t", "template_sha256": "0" * 64}
    md = "\n".join(judge_markdown(add_judge(summary, doc)))
    assert "– [–, –] (LC not estimable: length separates the verdicts)" in md


def test_lc_resamples_that_separate_are_skipped_and_counted_and_too_many_leave_no_interval():
    # 16 prompts, two losses: one among the shortest answers, one in the middle. The full fit exists; a resample
    # holding the shortest loss and not the other is separated, and so are about a fifth of them: too many to place
    # the interval's ends (before: their drifting values were percentiles like any other)
    diffs = np.arange(-8.0, 8.0)
    outcomes = ["B" if i in (0, 9) else "A" for i in range(16)]
    records = [rec("v", f"p{i}", o, len_diff=int(d)) for i, (o, d) in enumerate(zip(outcomes, diffs))]
    (row,) = stats.pairwise_rows(records, n_boot=200)
    assert not math.isnan(row["lc_win_rate"]) and row["lc_resamples_skipped"] > 0.025 * 200
    assert math.isnan(row["lc_win_rate_ci_low"]) and math.isnan(row["lc_win_rate_ci_high"])
    assert row["lc_note"].startswith(f"LC interval not estimable: {row['lc_resamples_skipped']} of 200 resamples")
    # the hand computation's pairs, 50 a side: no resample separates, the interval is the percentiles of every refit;
    # 10 a side: one resample in nine has every longer answer winning, and the interval is not given
    (row,) = stats.pairwise_rows(_two_groups(), n_boot=100)
    assert row["lc_resamples_skipped"] == 0 and row["lc_note"] == ""
    (row,) = stats.pairwise_rows(_two_groups(10), n_boot=100)
    assert row["lc_win_rate"] == pytest.approx(2 / 3, abs=1e-6) and math.isnan(row["lc_win_rate_ci_low"])
    assert row["lc_resamples_skipped"] > 2.5


def test_single_grades_with_an_interval():
    grades = [4, 6, 8, None, 5, 7, 3, 6, 4]
    records = [{"cell": "v", "criterion": "overall", "prompt_id": f"p{i}", "job_seed": 0, "grade": g,
                "outcome": "graded" if g else "unparsed"} for i, g in enumerate(grades)]  # fmt: skip
    (row,) = stats.single_rows(records, n_boot=200)
    assert row["grade"] == pytest.approx(43 / 8) and row["graded"] == 8 and row["unparsed"] == 1
    assert row["grade_ci_low"] < row["grade"] < row["grade_ci_high"]


def _key_and_sheets(n: int = 6):
    items = {f"i{i}": {"cell": "v" if i < n else "base", "prompt_id": f"p{i % n}", "job_seed": 0, "sample": 0}
             for i in range(2 * n)}  # fmt: skip
    r1 = {f"i{i}": {"overall": 1 + (i * 7) % 5} for i in range(2 * n)}
    r2 = {f"i{i}": {"overall": 1 + (i * 3) % 5} for i in range(2 * n)}
    return {"items": items, "criteria": ["overall"]}, {"r1": r1, "r2": r2}


def test_spearman_agreement_matches_scipy_on_fixed_data():
    key, sheets = _key_and_sheets(8)
    humans = stats.human_means(key, sheets)
    grades = [3, 9, 4, 7, 2, 8, 5, 6]
    records = [{"cell": "v", "criterion": "overall", "prompt_id": f"p{i}", "job_seed": 0, "sample": 0, "grade": g}
               for i, g in enumerate(grades)]  # fmt: skip
    (row,) = stats.agreement(records, humans, "single", n_boot=200)
    means = [(sheets["r1"][f"i{i}"]["overall"] + sheets["r2"][f"i{i}"]["overall"]) / 2 for i in range(8)]
    assert row["value"] == pytest.approx(sps.spearmanr(grades, means).statistic)
    assert row["n"] == 8 and row["ci_low"] <= row["value"] <= row["ci_high"]


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
        mine, base = humans[("v", f"p{i}", 0, 0)]["overall"], humans[("base", f"p{i}", 0, 0)]["overall"]
        if o in ("A", "B") and mine != base:
            expect.append((o == "A") == (mine > base))
    assert row["n"] == len(expect) and row["value"] == pytest.approx(sum(expect) / len(expect))
    assert stats.spearman(np.array([[1, 2], [2, 2], [3, 2]])) is math.nan or math.isnan(
        stats.spearman(np.array([[1, 2], [2, 2], [3, 2]]))
    )


def test_human_agreement_matches_each_sample_to_its_own_ratings():
    # one prompt and seed, two samples of the variant, each rated apart: the judge's verdict on sample k is
    # compared with sample k's ratings (before: the key had no sample, so one sample's ratings stood for both)
    items = {"a": {"cell": "v", "prompt_id": "p0", "job_seed": 0, "sample": 0},
             "b": {"cell": "v", "prompt_id": "p0", "job_seed": 0, "sample": 1},
             "c": {"cell": "base", "prompt_id": "p0", "job_seed": 0, "sample": 0}}  # fmt: skip
    sheets = {"r1": {"a": {"overall": 5}, "b": {"overall": 1}, "c": {"overall": 3}}}
    humans = stats.human_means({"items": items}, sheets)
    assert humans[("v", "p0", 0, 1)]["overall"] == 1 and humans[("v", "p0", 0, 0)]["overall"] == 5
    # the judge prefers sample 0 to the baseline and the baseline to sample 1: as the rater did, both times
    records = [rec("v", "p0", "A", sample=0), rec("v", "p0", "B", sample=1)]
    (row,) = stats.agreement(records, humans, "pairwise", n_boot=0)
    assert (row["n"], row["value"]) == (2, 1.0)
    # a key exported before samples were rated names none: its items are sample 0
    old = stats.human_means({"items": {"a": {"cell": "v", "prompt_id": "p0", "job_seed": 0}}}, sheets)
    assert list(old) == [("v", "p0", 0, 0)]


def test_verdicts_stored_before_samples_were_judged_still_meet_their_ratings():
    """A judge-verdicts.jsonl line written before a verdict named its sample and the baseline's answer (what a
    recomputed summary reads back, controller.judge.report.stored_judge) raised KeyError: it is sample 0 against
    the baseline's answer at the same seed."""
    items = {
        "a": {"cell": "v", "prompt_id": "p0", "job_seed": 0},
        "c": {"cell": "base", "prompt_id": "p0", "job_seed": 0},
    }
    humans = stats.human_means({"items": items}, {"r1": {"a": {"overall": 5}, "c": {"overall": 3}}})
    old = {"cell": "v", "criterion": "overall", "prompt_id": "p0", "job_seed": 0, "outcome": "A", "baseline": "base"}
    (row,) = stats.agreement([old], humans, "pairwise", n_boot=0)
    assert (row["n"], row["value"]) == (1, 1.0)
