"""Calibrated intervals: the BCa bootstrap and the exact delete-one-prompt jackknives,
each checked against an independent computation written here (numpy, scipy, NLTK)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from scipy import stats as sps

from controller.metrics import METRICS, cell_data
from controller.metrics.distinct import distinct_leave_one_out
from controller.metrics.selfbleu import self_bleu_leave_one_out
from controller.report.aggregate import summarize
from tests.helpers_report import make_sweep

VOCAB = ["the", "a", "of", "and", "to", "in", "was", "she", "he", "it", "her", "his", "that", "with"]


def row(summary, strategy):
    return summary[summary["strategy"] == strategy].iloc[0]


def random_groups(rng: random.Random, n_groups: int, size: int) -> tuple[list[list[str]], list[list[int]]]:
    docs = [[rng.choice(VOCAB[: rng.randint(2, len(VOCAB))]) for _ in range(rng.randint(0, 14))]
            for _ in range(n_groups * size)]  # fmt: skip
    return docs, [list(range(g * size, (g + 1) * size)) for g in range(n_groups)]


def nltk_self_bleu(docs: list[list[str]]) -> float:
    smooth = SmoothingFunction().method1
    scores = [sentence_bleu(docs[:i] + docs[i + 1 :], d, smoothing_function=smooth) for i, d in enumerate(docs)]
    return float(np.mean(scores))


@pytest.mark.parametrize("size", [1, 3])
def test_self_bleu_leave_one_out_equals_nltk_on_each_remainder(size):
    rng = random.Random(size)
    for _ in range(4):
        docs, groups = random_groups(rng, rng.randint(3, 7), size)
        fast = self_bleu_leave_one_out(docs, groups)
        for g, members in enumerate(groups):
            rest = [d for i, d in enumerate(docs) if i not in members]
            assert fast[g] == pytest.approx(nltk_self_bleu(rest), abs=1e-12)


def test_distinct_leave_one_out_equals_sets_counted_here():
    docs, groups = random_groups(random.Random(7), 9, 3)
    for n in (1, 2, 3):
        fast = distinct_leave_one_out(docs, groups, n)
        for g, members in enumerate(groups):
            grams = [tuple(d[i : i + n]) for k, d in enumerate(docs) if k not in members for i in range(len(d) - n + 1)]
            assert fast[g] == (len(set(grams)) / len(grams) if grams else pytest.approx(math.nan, nan_ok=True))


@pytest.fixture(scope="module")
def data_and_summary():
    data = make_sweep(seeds=(0, 1, 2), n_prompts=20)
    return data, summarize(data, n_boot=2000, seed=1)


def top_p_prompts(data):
    by_prompt: dict[str, list] = {}
    for g in data.generations:
        if g.strategy == "top_p":
            by_prompt.setdefault(g.prompt_id, []).append(g)
    return list(by_prompt.values())


def test_jackknife_interval_of_a_corpus_metric_is_the_textbook_one(data_and_summary):
    data, summary = data_and_summary
    prompts = top_p_prompts(data)
    distinct = METRICS.get("distinct_2").fn
    full = distinct(cell_data([g for p in prompts for g in p]))
    loo = np.array([distinct(cell_data([g for k, p in enumerate(prompts) if k != j for g in p]))
                    for j in range(len(prompts))])  # fmt: skip
    G = len(prompts)
    se = math.sqrt((G - 1) / G * np.sum((loo - loo.mean()) ** 2))
    half = sps.t.ppf(0.975, G - 1) * se
    r = row(summary, "top_p")
    assert r["distinct_2_ci_low"] == pytest.approx(full - half) and r["distinct_2_ci_high"] == pytest.approx(
        full + half
    )


def test_bca_interval_of_a_ratio_matches_an_independent_bca(data_and_summary):
    """BCa written out here (bias from the replicates, acceleration from the jackknife), 20,000 draws."""
    data, summary = data_and_summary
    prompts = top_p_prompts(data)
    words = np.array([sum(len(w) for w in cell_data(p).words) for p in prompts], dtype=float)
    n = np.array([len(p) for p in prompts], dtype=float)
    theta = words.sum() / n.sum()
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(n), size=(20000, len(n)))
    reps = words[idx].sum(1) / n[idx].sum(1)
    z0 = sps.norm.ppf(np.mean(reps < theta))
    loo = np.array([(words.sum() - words[j]) / (n.sum() - n[j]) for j in range(len(n))])
    d = loo.mean() - loo
    a = np.sum(d**3) / (6 * np.sum(d**2) ** 1.5)
    z = sps.norm.ppf([0.025, 0.975])
    alphas = sps.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    lo, hi = np.quantile(reps, alphas)
    r = row(summary, "top_p")
    assert r["mean_length"] == pytest.approx(theta)
    width = hi - lo
    assert abs(r["mean_length_ci_low"] - lo) < 0.1 * width and abs(r["mean_length_ci_high"] - hi) < 0.1 * width
    assert summary.attrs["ci"]["methods"]["mean_length"] == "bootstrap"
