"""Calibrated intervals: the BCa bootstrap and the exact delete-one-prompt jackknives,
each checked against an independent computation written here (numpy, scipy, NLTK)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from controller.metrics import METRICS, cell_data
from controller.metrics.distinct import distinct_items
from controller.metrics.selfbleu import self_bleu_leave_one_out
from controller.report.compute.aggregate import summarize
from tests.support.intervals import bootstrap_t, edgeworth_t, smoothed
from tests.support.report import make_sweep

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
    """From the hashed n-grams of each prompt (`distinct_items`), exactly the distinct-n of each remainder."""
    docs, groups = random_groups(random.Random(7), 9, 3)
    for n in (1, 2, 3):
        fast = distinct_items(docs, groups, n).leave_one_out()
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


def test_jackknife_interval_of_a_corpus_metric_is_a_skew_corrected_t_of_its_pseudo_values(data_and_summary):
    data, summary = data_and_summary
    prompts = top_p_prompts(data)
    distinct = METRICS.get("distinct_2").fn
    full = distinct(cell_data([g for p in prompts for g in p]))
    loo = np.array([distinct(cell_data([g for k, p in enumerate(prompts) if k != j for g in p]))
                    for j in range(len(prompts))])  # fmt: skip
    G = len(prompts)
    pseudo = G * full - (G - 1) * loo
    assert pseudo.std(ddof=1) / math.sqrt(G) == pytest.approx(math.sqrt((G - 1) / G * np.sum((loo - loo.mean()) ** 2)))
    logit, expit = (lambda x: np.log(x / (1 - x))), (lambda x: 1 / (1 + np.exp(-x)))  # a share: on the logit scale
    pseudo = G * logit(full) - (G - 1) * logit(loo)
    lo, hi = expit(np.array(edgeworth_t(pseudo, logit(full))))
    r = row(summary, "top_p")
    assert r["distinct_2"] == pytest.approx(full)
    assert (r["distinct_2_ci_low"], r["distinct_2_ci_high"]) == pytest.approx((lo, hi), rel=1e-9)


def test_bootstrap_interval_of_a_ratio_is_an_independent_bootstrap_t(data_and_summary):
    data, summary = data_and_summary
    prompts = top_p_prompts(data)
    words = np.array([sum(len(w) for w in cell_data(p).words) for p in prompts], dtype=float)
    n = np.array([len(p) for p in prompts], dtype=float)
    theta = words.sum() / n.sum()
    lo, hi = bootstrap_t(np.stack([words, n], 1), theta, t_floor=True, smooth=True)
    r = row(summary, "top_p")
    assert r["mean_length"] == pytest.approx(theta)
    width = hi - lo
    assert abs(r["mean_length_ci_low"] - lo) < 0.08 * width and abs(r["mean_length_ci_high"] - hi) < 0.08 * width
    assert summary.attrs["ci"]["methods"]["mean_length"] == "bootstrap"


def test_paired_difference_interval_p_value_and_holm_match_independent_computations(data_and_summary):
    data, summary = data_and_summary
    r = row(summary, "top_p")
    assert r["baseline"] == row(summary, "greedy")["cell"]  # default: the first cell of the same model
    assert math.isnan(row(summary, "greedy")["mean_length_diff"])  # the baseline itself has none
    per = {}
    for strategy in ("top_p", "greedy"):
        by_prompt: dict[str, list] = {}
        for g in data.generations:
            if g.strategy == strategy:
                by_prompt.setdefault(g.prompt_id, []).append(len(cell_data([g]).words[0]))
        per[strategy] = by_prompt
    ids = sorted(per["top_p"])
    a = np.array([[sum(per["top_p"][i]), len(per["top_p"][i])] for i in ids], dtype=float)
    b = np.array([[sum(per["greedy"][i]), len(per["greedy"][i])] for i in ids], dtype=float)
    diff = a[:, 0].sum() / a[:, 1].sum() - b[:, 0].sum() / b[:, 1].sum()
    assert r["mean_length_diff"] == pytest.approx(diff)
    # the permutation test written out: swap each prompt's two cells at random
    rng = np.random.default_rng(1)
    swaps = rng.random((20000, len(ids))) < 0.5
    ax = np.where(swaps[..., None], b, a).sum(1)
    bx = np.where(swaps[..., None], a, b).sum(1)
    null = ax[:, 0] / ax[:, 1] - bx[:, 0] / bx[:, 1]
    p = np.mean(np.abs(null) >= abs(diff) - 1e-12)
    assert r["mean_length_diff_p"] == pytest.approx(p, abs=0.03)
    assert r["mean_length_diff_ci_low"] <= diff <= r["mean_length_diff_ci_high"]
    # Holm over every p-value of the table, written out
    cols = [c for c in summary.columns if c.endswith("_diff_p")]
    ps = [(i, c, summary.loc[i, c]) for i in summary.index for c in cols if np.isfinite(summary.loc[i, c])]
    order = sorted(ps, key=lambda x: x[2])
    m, running = len(order), 0.0
    for k, (i, c, pv) in enumerate(order):
        running = max(running, min(1.0, (m - k) * pv))
        assert summary.loc[i, f"{c}_holm"] == pytest.approx(running)


def test_a_named_baseline_and_unequal_cells():
    data = make_sweep(seeds=(0, 1), n_prompts=8)
    summary = summarize(data, n_boot=200, baseline="top_p")
    assert row(summary, "greedy")["baseline"] == row(summary, "top_p")["cell"]
    assert math.isnan(row(summary, "top_p")["rep_2_diff"]) and not math.isnan(row(summary, "greedy")["rep_2_diff"])
    assert row(summary, "reference")["baseline"] is None


def test_comparisons_reach_the_markdown_html_csv_cli_and_notebook(tmp_path):
    from click.testing import CliRunner

    from controller.cli import main
    from controller.report.api import comparisons, load_summary
    from controller.report.render.write import render
    from tests.support.report import write_sweep
    from worker.core import paths
    from worker.store import FileStore

    store = FileStore(tmp_path / "store")
    data = make_sweep(seeds=(0, 1), n_prompts=8)
    write_sweep(store, data)
    res = CliRunner().invoke(
        main, ["report", data.sweep_id, "--baseline", "top_p", "--n-boot", "200", "--store", store.url]
    )
    assert res.exit_code == 0, res.output
    summary = load_summary(data.sweep_id, store=store, recompute=True, n_boot=200, baseline="top_p")
    csv = render("csv", summary, data).decode().splitlines()[0].split(",")
    assert {"baseline", "rep_2_diff", "rep_2_diff_ci_low", "rep_2_diff_ci_high", "rep_2_diff_p"} <= set(csv)
    assert "rep_2_diff_p_holm" in csv
    md = render("md", summary, data).decode()
    assert "## Paired comparisons" in md and "Δ rep_4" in md
    page = render("html", summary, data).decode()
    assert '<details id="comparisons">' in page  # collapsed behind a toggle
    assert 'data-col="rep_2_diff"' not in page  # not in the main table
    long = comparisons(summary)
    greedy = summary[summary["strategy"] == "greedy"].iloc[0]
    got = long[(long["cell"] == greedy["cell"]) & (long["metric"] == "rep_2")].iloc[0]
    assert got["diff"] == greedy["rep_2_diff"] and got["baseline"] == greedy["baseline"]
    stored = store.read_bytes(paths.report_key(data.tenant, data.sweep_id, "summary.csv")).decode()
    assert "rep_2_diff_p_holm" in stored.splitlines()[0]


def test_a_jackknife_interval_is_never_inside_students_t_and_keeps_its_skew():
    from scipy import stats

    from controller.report.stats.paired import pseudo_interval

    pseudo = np.random.default_rng(3).lognormal(0.0, 1.0, 16)  # skewed pseudo-values of 16 prompts
    center = float(pseudo.mean())
    lo, hi = pseudo_interval(pseudo, center, n_boot=4000, rng=np.random.default_rng(0))
    half = stats.t.ppf(0.975, 15) * pseudo.std(ddof=1) / math.sqrt(16)  # Student's t, written out
    assert lo <= center - half + 1e-12 and hi >= center + half - 1e-12
    assert hi - center > center - lo  # the bootstrap-t's longer right side stays
    want = bootstrap_t(np.stack([pseudo, np.ones(16)], 1), center, t_floor=True)
    assert abs(lo - want[0]) < 0.05 * (want[1] - want[0]) and abs(hi - want[1]) < 0.05 * (want[1] - want[0])


def test_a_paired_interval_is_a_bootstrap_t_at_each_replicates_sums_never_inside_students_t():
    """bench_paired.py, the null (B drawn as A, common random numbers): rep_2's paired interval covered 0 in
    89.7% of 1,000 simulations at 16 prompts, because most prompts' differences are ~0 and a few looping
    prompts' large, and the bootstrap-t's quantiles came out inside Student's. Such a table: 16 prompts,
    two of them far apart in the two cells."""
    from scipy.stats import t as student

    from controller.metrics import ratio
    from controller.report.stats.paired import paired_interval
    from tests.support.intervals import paired_bootstrap_t

    rng = np.random.default_rng(3)
    n = rng.integers(20, 60, 16).astype(float)
    base = rng.binomial(n.astype(int), 0.02).astype(float)
    a = np.stack([base, n], 1)
    b = a.copy()
    b[:, 0] += rng.integers(0, 2, 16)  # the cells' texts differ a little at every prompt...
    b[:2, 0] += [14, 9]  # ...and two prompts loop in one cell only
    lo, hi = paired_interval(a, b, ratio, n_boot=4000, rng=np.random.default_rng(0))
    want_lo, want_hi = paired_bootstrap_t(a, b)
    width = want_hi - want_lo
    assert abs(lo - want_lo) < 0.05 * width and abs(hi - want_hi) < 0.05 * width
    diff = a[:, 0].sum() / a[:, 1].sum() - b[:, 0].sum() / b[:, 1].sum()
    d = (a[:, 0] - a[:, 0].sum() / a[:, 1].sum() * a[:, 1]) / a[:, 1].sum()
    d -= (b[:, 0] - b[:, 0].sum() / b[:, 1].sum() * b[:, 1]) / b[:, 1].sum()
    half = student.ppf(0.975, 15) * math.sqrt(16 * d.var(ddof=1))
    assert lo <= diff - half + 1e-12 and hi >= diff + half - 1e-12


def test_bleu_has_a_studentised_interval_equal_to_an_independent_bootstrap_t():
    """BLEU's counts were rounded before sacrebleu saw them, so the numerical gradient of the delta-method SE
    was 0 and every BLEU interval was [θ, θ]; then the percentile bootstrap, which covered 85% at 16 prompts
    (56% where 4-gram matches are few). Now the bootstrap-t, written out here: corpus BLEU of summed counts in
    numpy (checked against sacrebleu.corpus_bleu), each replicate's delta-method SE from BLEU's analytic gradient
    at the sample's sums (every generation longer than its reference: no brevity penalty) and smoothed against
    the replicates' values, neither side inside Student's t(G - 1)."""
    import sacrebleu
    from scipy.stats import t as student

    from controller.metrics import METRICS
    from controller.report.stats.intervals import confidence_intervals, evaluate, prompt_groups

    rng = random.Random(5)
    words = ["the", "a", "cat", "sat", "on", "mat", "dog", "ran", "to", "house", "and", "then"]
    refs = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(24)]
    texts, keys, references = [], [], []
    for g, ref in enumerate(refs):
        for _ in range(3):  # three seeds: a copy of the reference with a few words changed and one more
            out = [w if rng.random() < 0.6 else rng.choice(words) for w in ref.split()] + [rng.choice(words)]
            texts.append(" ".join(out)), keys.append(f"p{g}"), references.append(ref)
    cell = cell_data([{"text": t, "reference": r} for t, r in zip(texts, references)])
    groups = prompt_groups(keys)
    metric = METRICS.get("bleu")
    values = evaluate([("bleu", metric)], cell)
    lo, hi, method = confidence_intervals([("bleu", metric)], cell, values, groups, n_boot=4000, n_boot_corpus=100,
                                          rng=np.random.default_rng(0))["bleu"]  # fmt: skip

    sentence = sacrebleu.metrics.BLEU(effective_order=True)
    stats = [sentence.sentence_score(t, [r]) for t, r in zip(texts, references)]
    per_generation = np.array([[*s.counts, *s.totals] for s in stats], dtype=float)
    x = np.stack([per_generation[items].sum(0) for items in groups])  # each prompt's counts and totals
    assert all(s.sys_len > s.ref_len for s in stats)

    def bleu(sums):  # (..., 8): 100 · exp(mean log precision); every count > 0 here, so no smoothing
        return 100 * np.exp(np.mean(np.log(sums[..., :4] / sums[..., 4:]), axis=-1))

    S = x.sum(0)
    theta = float(bleu(S))
    assert values["bleu"] == pytest.approx(theta, rel=1e-12)
    assert theta == pytest.approx(sacrebleu.corpus_bleu(texts, [references]).score, rel=1e-12)
    grad = theta / 4 * np.concatenate([1 / S[:4], -1 / S[4:]])
    G = len(x)
    idx = np.random.default_rng(1).integers(0, G, (20000, G))
    se = np.sqrt(G * (x @ grad).var(ddof=1))
    se_star = np.sqrt(G * (x[idx] @ grad).var(axis=-1, ddof=1))
    estimates = bleu(x[idx].sum(1))
    curve = smoothed(estimates, se_star)  # each replicate studentised by the SE its estimate implies
    q_low, q_high = np.percentile((estimates - theta) / curve(estimates), [2.5, 97.5]) * curve(theta)
    q = student.ppf(0.975, G - 1) * se
    want_lo, want_hi = theta - max(q_high, q), theta - min(q_low, -q)
    width = want_hi - want_lo
    assert method == "bootstrap" and lo < theta < hi
    assert abs(lo - want_lo) < 0.05 * width and abs(hi - want_hi) < 0.05 * width


def test_a_rare_event_share_gets_a_percentile_interval_inside_zero_one():
    """The quickstart's rep-4 of a sampling cell (one repeated 4-gram in 96 generations) had the interval
    [-0.00005, 222606]: most replicates draw no repetition, their delta-method SE is 0 (numerical-gradient noise
    of 1e-12 where the gradient is not exact), and t = (0 - θ) / 1e-12 took over the quantile. More than 2.5% of
    the replicates without spread: the percentile interval, written out here."""
    from controller.metrics import METRICS
    from controller.report.stats.intervals import bootstrap

    totals = np.array([118.0, 113, 122, 119, 122, 113, 126, 125, 116, 124, 118, 120, 122, 119, 116, 122] * 2)
    stats = np.stack([totals, totals], axis=1)  # [unique, total] 4-grams of each prompt: nothing repeats...
    stats[3, 0] -= 1  # ...but one 4-gram of one prompt
    groups = [[g] for g in range(len(stats))]
    metric = METRICS.get("rep_4")
    lo, hi = bootstrap(metric, cell_data([]), groups, n_boot=4000, rng=np.random.default_rng(0), stats=stats)
    draws = np.random.default_rng(1).integers(0, len(stats), (20000, len(stats)))
    drawn = stats[draws].sum(axis=1)
    want = np.percentile(1 - drawn[:, 0] / drawn[:, 1], [2.5, 97.5])
    assert 0 <= lo <= hi <= 1
    assert lo == pytest.approx(want[0], abs=1e-9) and hi == pytest.approx(want[1], rel=0.2)


def test_a_skewed_cell_is_studentised_by_the_se_its_replicate_implies():
    """issue 46: rep_2's bootstrap-t interval at 32 prompts was 1.57x the width of a normal interval with the
    true spread (skewed process, bench_coverage): a replicate that draws none of the cell's few heavy prompts
    has a tiny SE of its own, its t reaches far out, and so does the interval. Now each replicate is studentised
    by the SE its estimate implies (the replicates' SEs smoothed against their estimates), written out here
    (tests/support/intervals.py): on 32 prompts, three of them long, half as wide as the per-replicate
    bootstrap-t, and still never inside Student's t(G - 1)."""
    from scipy.stats import t as student

    from controller.report.stats.intervals import bootstrap

    lengths = np.random.default_rng(4).integers(20, 40, 32).astype(float)
    lengths[:3] = [150, 220, 300]
    stats = np.stack([lengths, np.ones(32)], 1)  # mean_length's [words, 1] of one generation per prompt
    theta = float(lengths.mean())
    lo, hi = bootstrap(METRICS.get("mean_length"), cell_data([]), [[g] for g in range(32)], n_boot=8000,
                       rng=np.random.default_rng(0), stats=stats)  # fmt: skip
    want = bootstrap_t(stats, theta, t_floor=True, smooth=True)
    width = want[1] - want[0]
    assert abs(lo - want[0]) < 0.05 * width and abs(hi - want[1]) < 0.05 * width
    per_replicate = bootstrap_t(stats, theta, t_floor=True)  # the construction before
    assert hi - lo < 0.6 * (per_replicate[1] - per_replicate[0])
    half = student.ppf(0.975, 31) * lengths.std(ddof=1) / math.sqrt(32)
    assert lo <= theta - half + 1e-9 and hi >= theta + half - 1e-9 and hi - theta > theta - lo


def test_the_spread_curve_is_the_replicates_mean_se_by_estimate():
    """`spread_curve`: replicates in ten equal-count groups by estimate, each group's mean SE at its median
    estimate, log-linear between and flat outside; on SEs constant within each group it returns them at the
    groups' medians, their geometric mean halfway between, and the end groups' beyond (hand-computed here)."""
    from controller.report.stats.bootstrap_t import spread_curve

    estimates = np.arange(100, dtype=float)[::-1] / 10  # unsorted on purpose
    spreads = np.repeat(np.arange(1.0, 11.0), 10)[::-1]  # group g (estimates g..g+0.9) has SE g + 1
    curve = spread_curve(estimates, spreads)
    medians = np.arange(10) + 0.45
    assert np.allclose(curve(medians), np.arange(1.0, 11.0))
    assert curve(-5.0) == pytest.approx(1.0) and curve(50.0) == pytest.approx(10.0)
    between = curve(0.95)  # halfway between the first two knots, on the log scale
    assert between == pytest.approx(math.sqrt(1.0 * 2.0))
