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
