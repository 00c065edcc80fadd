"""The intervals of a task's accuracy: a share of one 0/1 outcome a prompt gets the exact interval of its prompts."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from controller.metrics import METRICS
from controller.report.compute.cells import Settings, score
from controller.report.stats.intervals import prompt_groups
from controller.report.stats.shares import binary_prompts
from tests.support.tasks import task_cell

pytestmark = pytest.mark.pure


def test_pass_at_k_of_k_samples_and_maj_at_k_get_the_exact_interval_of_their_prompts():
    """issue 46: pass@8 of 8 samples (right if any is) and maj@8 (the vote is right or not) are one 0/1 outcome a
    prompt, so their count over G prompts is Binomial(G, p) and the exact Clopper–Pearson interval is theirs, as
    exact_match's of one generation a prompt is. pass@8's bootstrap-t had covered 87.8% at 16 prompts and 91.8% at
    32 on benchmarks/bench_accuracy.py (maj@8's as well, 1.16 times as wide at 16). exact_match of the same samples
    (c / 8 a prompt) keeps the bootstrap, and a prompt with fewer than k generations is not one of pass@k's trials."""
    rng = np.random.default_rng(3)
    prompts = [f"p{i}" for i in range(16)]
    p = rng.beta(0.5, 0.5, size=len(prompts))
    per_prompt = {
        pid: ([f"#{i}" if rng.random() < p[i] else f"#{900 + i}" for _ in range(8)], [str(i)])  # the gold first
        for i, pid in enumerate(prompts)
    }
    per_prompt["short"] = (["#1", "#2", "#3"], ["1"])  # 3 generations: not one of pass@8's or maj@8's prompts
    cell = task_cell(per_prompt)
    names = ["exact_match", "pass@8", "maj@8"]
    settings = Settings(tuple(names), with_ci=True, n_boot=400, n_boot_corpus=2, seed=0, sample_size=None)
    row = {"model": "m", "strategy": "top_p"}
    groups = prompt_groups(cell.prompt_ids)
    selected = [(n, METRICS.get(n)) for n in names]
    _, kept = score(selected, settings, row, cell, groups, "top_p", prompts=list(per_prompt))
    right = {pid: [t == f"#{i}" for t in per_prompt[pid][0]] for i, pid in enumerate(prompts)}
    for name, outcome in (("pass@8", any), ("maj@8", lambda r: sum(r) >= 4)):  # a 4-4 tie: the gold, first in order
        successes = sum(outcome(r) for r in right.values())
        assert 0 < successes < 16 and row[name] == pytest.approx(successes / 16)
        ci = sps.binomtest(successes, 16).proportion_ci(confidence_level=0.95, method="exact")
        assert (row[f"{name}_ci_low"], row[f"{name}_ci_high"]) == pytest.approx((ci.low, ci.high)), name
    assert any(4 <= sum(r) < 8 for r in right.values()) and any(0 < sum(r) < 4 for r in right.values())
    assert binary_prompts(kept.kept["exact_match"][1]) is None  # c / 8 a prompt: the bootstrap's
    assert row["exact_match_ci_low"] < row["exact_match"] < row["exact_match_ci_high"]


def exact_match_interval(per_prompt: dict) -> tuple[dict, np.ndarray]:
    """The report's exact_match value and interval of a task cell (`cells.score`), and its prompts' sums."""
    cell = task_cell(per_prompt)
    settings = Settings(("exact_match",), with_ci=True, n_boot=400, n_boot_corpus=2, seed=0, sample_size=None)
    row = {"model": "m", "strategy": "top_p"}
    selected = [("exact_match", METRICS.get("exact_match"))]
    _, kept = score(selected, settings, row, cell, prompt_groups(cell.prompt_ids), "top_p", prompts=list(per_prompt))
    return row, kept.kept["exact_match"][1]


def answers(rights: list[int], k: int) -> dict:
    """Prompt i with k answers of which rights[i] are right (its gold i first in the list of golds)."""
    return {f"p{i}": ([f"#{i}"] * r + [f"#{900 + i}"] * (k - r), [str(i)]) for i, r in enumerate(rights)}


def test_exact_match_of_several_answers_a_prompt_gets_korn_and_graubards_interval():
    """issue 46: with most prompts nearly always right, a cell that drew none of the few hard ones shows shares of
    3/3 and 2/3, and the bootstrap-t of so little spread sat near 1: it covered 86-92% at 16 and 32 prompts
    (bench_accuracy.py, Beta(4, 0.3) and logit-normal(3, 1.5)). Answers drawn independently given their prompt can
    only add variance to N independent answers, so the interval is Clopper-Pearson's at the effective number of
    answers p(1 - p) / SE², at most N: never narrower than the N answers' own. Checked here by hand."""
    rights = [3] * 14 + [2, 2]
    row, sums = exact_match_interval(answers(rights, 3))
    v, w = np.array(rights, float), np.full(16, 3.0)
    p = v.sum() / w.sum()
    se = np.sqrt(np.sum((v - p * w) ** 2) / (16 * 15)) / 3
    n = min(48.0, p * (1 - p) / se**2)
    x = p * n
    hand = sps.beta.ppf(0.025, x, n - x + 1), sps.beta.ppf(0.975, x + 1, n - x)
    assert row["exact_match"] == pytest.approx(46 / 48)
    assert (row["exact_match_ci_low"], row["exact_match_ci_high"]) == pytest.approx(hand)
    own = sps.binomtest(46, 48).proportion_ci(confidence_level=0.95, method="exact")
    assert row["exact_match_ci_low"] <= own.low + 1e-12 and row["exact_match_ci_high"] >= own.high - 1e-12
    assert row["exact_match_ci_low"] < 0.88  # the bootstrap-t's was above 0.9 here


def test_korn_and_graubards_interval_widens_with_the_prompts_spread_and_leaves_the_exact_cases_as_they_were():
    rng = np.random.default_rng(5)
    spread = [int(r) for r in rng.binomial(8, rng.beta(0.5, 0.5, size=24))]  # easy and hard prompts: a design effect
    row, sums = exact_match_interval(answers(spread, 8))
    right, total = sum(spread), 8 * len(spread)
    own = sps.binomtest(right, total).proportion_ci(confidence_level=0.95, method="exact")
    assert 0 < right < total and row["exact_match_ci_low"] < own.low - 0.05 and row["exact_match_ci_high"] > own.high
    # every answer right: the exact interval of none seen off it over the 16 prompts, as before
    row, _ = exact_match_interval(answers([3] * 16, 3))
    assert (row["exact_match_ci_low"], row["exact_match_ci_high"]) == pytest.approx((0.025 ** (1 / 16), 1.0))
    # every prompt right or wrong in all its answers: one 0/1 outcome a prompt, the exact interval of the prompts
    row, _ = exact_match_interval(answers([3] * 10 + [0] * 6, 3))
    ci = sps.binomtest(10, 16).proportion_ci(confidence_level=0.95, method="exact")
    assert (row["exact_match_ci_low"], row["exact_match_ci_high"]) == pytest.approx((ci.low, ci.high))


def test_pass_at_1_of_n_samples_a_prompt_takes_exact_matchs_interval_and_keeps_the_bootstrap_where_n_differs():
    """pass@1 of n samples a prompt is exact_match's share of the same answers (c / n a prompt): its interval is the
    same, Korn and Graubard's from the prompts' counts; before, the two showed one number with two intervals. Where
    the prompts' samples differ in number, pass@1 (a mean of shares) is not the counts' ratio: the bootstrap-t."""
    rng = np.random.default_rng(11)
    rights = [int(r) for r in rng.binomial(8, rng.beta(4, 0.5, size=20))]
    per_prompt = answers(rights, 8)
    cell = task_cell(per_prompt)
    names = ("exact_match", "pass@1")
    settings = Settings(names, with_ci=True, n_boot=400, n_boot_corpus=2, seed=0, sample_size=None)
    row = {"model": "m", "strategy": "top_p"}
    score([(n, METRICS.get(n)) for n in names], settings, row, cell, prompt_groups(cell.prompt_ids), "top_p",
          prompts=list(per_prompt))  # fmt: skip
    assert 0 < sum(rights) < 160 and row["pass@1"] == pytest.approx(row["exact_match"])
    assert (row["pass@1_ci_low"], row["pass@1_ci_high"]) == pytest.approx(
        (row["exact_match_ci_low"], row["exact_match_ci_high"])
    )
    per_prompt["p0"] = (per_prompt["p0"][0][:3], per_prompt["p0"][1])  # 3 samples for one prompt, 8 for the others
    cell = task_cell(per_prompt)
    row = {"model": "m", "strategy": "top_p"}
    score([(n, METRICS.get(n)) for n in names], settings, row, cell, prompt_groups(cell.prompt_ids), "top_p",
          prompts=list(per_prompt))  # fmt: skip
    assert row["pass@1"] != pytest.approx(row["exact_match"])  # a mean of shares, not the ratio of the counts
    assert row["pass@1_ci_low"] < row["pass@1"] < row["pass@1_ci_high"]
    assert (row["pass@1_ci_low"], row["pass@1_ci_high"]) != pytest.approx(
        (row["exact_match_ci_low"], row["exact_match_ci_high"])
    )
