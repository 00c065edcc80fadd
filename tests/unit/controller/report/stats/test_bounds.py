"""Every interval inside the values its quantity can take (`Metric.bounds`, `bootstrap_t.bounded`).

A bootstrap-t or Student's t interval over a few skewed prompts reaches past what its statistic can be: the chat
example's 8 prompts gave a mean length of [-0.8, 35.7] words, BLEU [-0.06, 0.17] and a difference of two rep-3 shares
[-19.4, 0.09]. Moving an end inside the bounds cannot lose the truth, which is inside them, and makes the interval no
wider than they are. Each case below is the old code's, outside its bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats as sps

from controller.cli import main
from controller.judge import stats as judge_stats
from controller.metrics import METRICS, cell_data
from controller.report.compute.cells import Settings, score
from controller.report.ratings.scores import rating_columns
from controller.report.stats.intervals import prompt_groups
from controller.report.stats.paired import compare_pair

pytestmark = pytest.mark.pure

NAMES = ("mean_length", "rep_3", "bleu")


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def cell(key: str, texts: list[str]):
    """`cells.score` of a cell of one generation a prompt, each prompt with a reference of its own: (row, stats)."""
    records = [{"text": t, "prompt_id": f"p{g}", "reference": words(f"r{g}_", 10)} for g, t in enumerate(texts)]
    data = cell_data(records)
    settings = Settings(NAMES, with_ci=True, n_boot=1000, n_boot_corpus=200, seed=0, sample_size=None)
    row = {"model": "m", "strategy": key}
    prompts = [f"p{g}" for g in range(len(texts))]
    selected = [(n, METRICS.get(n)) for n in NAMES]
    return row, score(selected, settings, row, data, prompt_groups(data.prompt_ids), key, prompts=prompts)[1]


def judged(outcomes: list[str]) -> list[dict]:
    """A judge's pairwise records of cell v against b, one a prompt, with these outcomes."""
    return [
        {"cell": "v", "baseline": "b", "criterion": "overall", "prompt_id": f"p{i}", "job_seed": 0, "outcome": o,
         "len_diff": 0}
        for i, o in enumerate(outcomes)
    ]  # fmt: skip


def rated(scores: dict[str, list[int]]):
    """The ratings' row of cell v: rater -> each item's score on the 1-5 scale."""
    n = len(next(iter(scores.values())))
    items = {f"i{i}": {"cell": "v", "prompt_id": f"p{i}", "job_seed": 0} for i in range(n)}
    sheets = {r: {f"i{i}": {"overall": s} for i, s in enumerate(v)} for r, v in scores.items()}
    return rating_columns({"items": items, "criteria": ["overall"]}, sheets).iloc[0]


def test_bounded_moves_each_end_inside_and_leaves_nan():
    from controller.report.stats.bootstrap_t import bounded, difference_bounds

    assert bounded((-0.8, 35.7), (0.0, None)) == (0.0, 35.7)
    assert bounded((-19.4, 0.09), (-1.0, 1.0)) == (-1.0, 0.09)
    assert bounded((1.2, 1.5), (0.0, 1.0)) == (1.0, 1.0)  # wholly past a bound: that bound
    assert bounded((-3.0, 4.0), (None, None)) == (-3.0, 4.0)
    low, high = bounded((math.nan, math.nan), (0.0, 1.0))
    assert math.isnan(low) and math.isnan(high)
    assert difference_bounds((0.0, 1.0)) == (-1.0, 1.0)
    assert difference_bounds((0.0, 100.0)) == (-100.0, 100.0)
    assert difference_bounds((0.0, None)) == (None, None)  # two mean lengths differ by any amount


def test_every_metric_declares_the_values_it_can_take():
    assert METRICS.get("mean_length").bounds == (0.0, None)
    assert METRICS.get("mean_new_tokens").bounds == (0.0, None)
    assert METRICS.get("perplexity").bounds == (1.0, None)
    assert METRICS.get("coherence").bounds == (None, 0.0)
    assert METRICS.get("bleu").bounds == (0.0, 100.0)
    for name in ("rep_2", "distinct_2", "self_bleu_4", "eos_rate", "rouge_1", "rouge_2", "rouge_l", "mauve"):
        assert METRICS.get(name).bounds == (0.0, 1.0), name
    assert METRICS.get("zipf").bounds == (None, None)
    listed = CliRunner().invoke(main, ["metrics"]).output
    assert "bleu  (corpus, higher is better; needs references; in [0, 100]; bootstrap" in listed
    assert "perplexity  (corpus, no direction; needs model; in [1, inf); bootstrap" in listed
    assert "zipf  (corpus, no direction; jackknife" in listed


@pytest.mark.parametrize(
    ("name", "lengths"),
    [
        ("mean_length", [2, 3, 1, 2, 4, 3, 2, 40]),  # the old code: [-4.0, 86.2]
        ("bleu", [5, 1, 1, 2, 1, 1, 1, 25]),  # the old code: [-1.09, ...]
    ],
)
def test_a_cell_interval_of_few_skewed_prompts_stays_inside_its_metric(name, lengths):
    row, _ = cell("few", [words(f"m{g}_", n) for g, n in enumerate(lengths)])
    assert row[f"{name}_ci_low"] == 0.0 < row[name] < row[f"{name}_ci_high"]


def test_a_paired_difference_of_shares_stays_inside_minus_one_to_one():
    # greedy loops in 2 prompts of 8, the sampler a little in 2 others: the old paired interval was [-2.88, -0.41]
    loop = " ".join(["x y z"] * 12)
    greedy = [f"{words(f'g{g}_', 3)} {loop}" if g < 2 else words(f"g{g}_", 4) for g in range(8)]
    sampler = [f"{words(f's{g}_', 4)} x y z x y z" if g in (0, 5) else words(f"s{g}_", 4) for g in range(8)]
    (_, a), (_, b) = cell("sampler", sampler), cell("greedy", greedy)
    out = compare_pair(a, b, {n: METRICS.get(n) for n in NAMES}, n_boot=1000, rng=np.random.default_rng(0))
    assert out["rep_3_diff_ci_low"] == -1.0 < out["rep_3_diff"] < out["rep_3_diff_ci_high"] < 0
    assert out["mean_length_diff_ci_low"] < -8  # a difference of two lengths is not bounded


def test_a_mean_rating_interval_stays_inside_the_scale():
    # 5 items rated by 2 raters: the old interval was [2.77, 5.05] on a 1-5 scale
    row = rated({"r1": [5, 5, 1, 4, 4], "r2": [5, 5, 5, 5, 4]})
    assert 1 <= row["rating_overall_ci_low"] < row["rating_overall"] < row["rating_overall_ci_high"] == 5


def test_a_judge_win_rate_interval_stays_inside_zero_to_one():
    # the old interval of 8 pairs was [0.63, 1.02]
    (row,) = judge_stats.pairwise_rows(judged(["A", "tie", "A", "tie", "tie", "A", "A", "A"]), n_boot=200)
    assert 0 < row["win_rate_ci_low"] < row["win_rate"] < row["win_rate_ci_high"] == 1.0


def test_scores_all_alike_get_the_exact_interval_of_none_seen_off_them():
    # 8 prompts, every pair won (or tied), every grade 10, every rating 5: the old intervals were [1, 1] ([1/2, 1/2]),
    # [10, 10] and [5, 5]
    u = 1 - 0.025 ** (1 / 8)  # none of 8 seen off the end: up to this share of them could be
    pairs = judged(["A"] * 8)
    (won,) = judge_stats.pairwise_rows(pairs, n_boot=200)
    assert (won["win_rate"], won["win_rate_ci_low"], won["win_rate_ci_high"]) == pytest.approx((1, 1 - u, 1))
    # the length-controlled one too (every resample's fit was the same, [1 - 4e-9, 1 - 5e-9])
    assert (won["lc_win_rate_ci_low"], won["lc_win_rate_ci_high"]) == pytest.approx((1 - u, 1))
    # every pair a tie: a win rate of 1/2, and up to u of the prompts could have gone either way
    (tied,) = judge_stats.pairwise_rows(judged(["tie"] * 8), n_boot=200)
    assert (tied["win_rate_ci_low"], tied["win_rate_ci_high"]) == pytest.approx((0.5 - u / 2, 0.5 + u / 2))
    assert (tied["lc_win_rate_ci_low"], tied["lc_win_rate_ci_high"]) == pytest.approx((0.5 - u / 2, 0.5 + u / 2))
    graded = [{**p, "grade": 10.0, "outcome": "graded"} for p in pairs]
    (grade,) = judge_stats.single_rows(graded, n_boot=200)
    assert (grade["grade_ci_low"], grade["grade_ci_high"]) == pytest.approx((10 - 9 * u, 10))
    row = rated({"r1": [5] * 8, "r2": [5] * 8})
    assert (row["rating_overall_ci_low"], row["rating_overall_ci_high"]) == pytest.approx((5 - 4 * u, 5))


def test_a_win_rate_of_one_decided_pair_a_prompt_is_the_exact_interval_of_its_wins():
    outcomes = ["A", "A", "B", "A", "A", "B", "A", "A", "A", "A"]  # 8 wins of 10, no tie
    (row,) = judge_stats.pairwise_rows(judged(outcomes), n_boot=200)
    exact = sps.binomtest(8, 10).proportion_ci(confidence_level=0.95, method="exact")
    assert (row["win_rate_ci_low"], row["win_rate_ci_high"]) == pytest.approx((exact.low, exact.high))


def test_a_share_whose_every_prompt_sits_at_one_value_inside_is_not_certain_of_it():
    from controller.report.stats.shares import within_scale

    u = 1 - 0.025 ** (1 / 16)
    assert within_scale((0.25, 0.25), 16, 0.95) == pytest.approx((0.25 - 0.25 * u, 0.25 + 0.75 * u))
    assert within_scale((0.0, 0.0), 16, 0.95) == pytest.approx((0.0, u))  # the bounds' case, as before
    assert within_scale((3.0, 3.0), 16, 0.95, (1.0, 5.0)) == pytest.approx((3 - 2 * u, 3 + 2 * u))
    assert within_scale((0.2, 0.3), 16, 0.95) == (0.2, 0.3)  # an interval with a width: as it is


def test_a_product_of_shares_with_no_repeat_anywhere_is_not_certain_of_it():
    """Diversity = Π (1 − rep-n) of 8 generations with no repeated n-gram: each rep-n got the exact interval of none
    seen, [0, 0.369], but diversity [1.000, 1.000]: its bootstrap's replicates, each a product of three ratios of 1,
    came out 1 − 5e-12 at the low end, and an interval of that width was taken for one with a width. Now an interval
    narrower than float noise is one without: [1 − u, 1], as its rep-n's."""
    from controller.report.stats.shares import within_scale

    u = 1 - 0.025 ** (1 / 8)
    names = ("rep_2", "diversity")
    records = [{"text": words(f"m{g}_", n), "prompt_id": f"p{g}"} for g, n in enumerate([7, 9, 6, 12, 8, 5, 10, 11])]
    data = cell_data(records)
    settings = Settings(names, with_ci=True, n_boot=1000, n_boot_corpus=200, seed=0, sample_size=None)
    row = {"model": "m", "strategy": "k"}
    selected = [(n, METRICS.get(n)) for n in names]
    score(selected, settings, row, data, prompt_groups(data.prompt_ids), "k", prompts=[f"p{g}" for g in range(8)])
    assert (row["rep_2"], row["rep_2_ci_low"], row["rep_2_ci_high"]) == pytest.approx((0, 0, u))
    assert (row["diversity"], row["diversity_ci_low"], row["diversity_ci_high"]) == pytest.approx((1, 1 - u, 1))
    assert within_scale((1 - 5e-12, 1.0), 8, 0.95) == pytest.approx((1 - u, 1))
    assert within_scale((0.5 - 1e-12, 0.5), 8, 0.95) == pytest.approx((0.5 - u / 2, 0.5 + u / 2))
