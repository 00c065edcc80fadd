"""A share's interval (controller/report/stats/shares.py): exact where every generation is alike or each prompt has
one 0/1 outcome, and any [0, 1] metric's where every prompt sits at its bound (issue 46)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from controller.metrics import METRICS, CellData
from controller.report.stats.intervals import confidence_intervals, evaluate, prompt_groups


@pytest.mark.parametrize("reason, G", [("length", 16), ("eos", 16), ("length", 40)])
def test_a_share_where_every_generation_is_alike_gets_the_exact_binomial_interval(reason, G):
    """No generation of the cell ended at EOS (or every one did): every bootstrap replicate is alike and the
    interval was [0, 0], as if no generation could ever end. The first generation of each prompt is an independent
    draw of the share, so the exact (Clopper-Pearson) interval of 0 (or G) successes in G trials holds it:
    [0, 1 - 0.025^(1/G)], written out here."""
    n = G * 3
    cell = CellData(texts=["a b"] * n, words=[["a", "b"]] * n, stop_reasons=[reason] * n)
    metrics = [("eos_rate", METRICS.get("eos_rate"))]
    values = evaluate(metrics, cell)
    groups = prompt_groups([f"p{i // 3}" for i in range(n)])
    (lo, hi, how), = confidence_intervals(metrics, cell, values, groups, n_boot=200, n_boot_corpus=20,
                                         rng=np.random.default_rng(0)).values()  # fmt: skip
    edge = 1 - 0.025 ** (1 / G)
    want = (0.0, edge) if reason == "length" else (1 - edge, 1.0)
    assert values["eos_rate"] == (reason == "eos")
    assert (lo, hi) == pytest.approx(want, rel=1e-9, abs=1e-12) and how == "bootstrap"


@pytest.mark.parametrize("G, seeds", [(16, 1), (9, 3), (40, 2)])
def test_a_metric_whose_every_prompt_sits_at_its_bound_gets_the_exact_interval_of_nothing_seen(G, seeds):
    """Every generation's words unique: rep-n 0 (no n-gram repeated), distinct-n 1 (every one unique), self-BLEU 0
    (none shared), diversity 1. Their intervals were [θ, θ], certainty from G prompts that cannot show what they
    did not draw: a share of prompts that loop (each moving the metric by at most its own share of the n-grams)
    of up to 1 - 0.025^(1/G) is as consistent with them as none. Now that exact interval of no event in G, as
    eos_rate's where every generation is alike; from the bound's side, written out here."""
    n = G * seeds
    words = [[f"w{i}-{j}" for j in range(12)] for i in range(n)]
    cell = CellData(texts=[" ".join(w) for w in words], words=words)
    names = ["rep_2", "rep_4", "distinct_1", "distinct_3", "self_bleu_4", "diversity", "mean_length"]
    metrics = [(m, METRICS.get(m)) for m in names]
    values = evaluate(metrics, cell)
    groups = prompt_groups([f"p{i // seeds}" for i in range(n)])
    got = confidence_intervals(metrics, cell, values, groups, n_boot=200, n_boot_corpus=20,
                               rng=np.random.default_rng(0))  # fmt: skip
    edge = 1 - 0.025 ** (1 / G)
    for m in ("rep_2", "rep_4", "self_bleu_4"):
        assert values[m] == 0.0 and got[m][:2] == pytest.approx((0.0, edge), rel=1e-9, abs=1e-12), m
    for m in ("distinct_1", "distinct_3", "diversity"):
        assert values[m] == 1.0 and got[m][:2] == pytest.approx((1 - edge, 1.0), rel=1e-9, abs=1e-12), m
    assert got["mean_length"][:2] == (12.0, 12.0)  # not a [0, 1] metric: no spread is no spread


@pytest.mark.parametrize("k, G", [(3, 128), (11, 32), (0, 20)])
def test_a_share_with_one_generation_a_prompt_gets_the_exact_binomial_interval_of_its_count(k, G):
    """One seed: each prompt's one 0/1 outcome (eos_rate here, a task's exact_match alike) is an independent
    draw of the share, and the count is Binomial(G, p). The bootstrap-t of a rare event had covered 85% at
    128 prompts (issue 46); the exact Clopper-Pearson interval of k in G, written out with scipy's beta."""
    cell = CellData(texts=["a b"] * G, words=[["a", "b"]] * G, stop_reasons=["eos"] * k + ["length"] * (G - k))
    metrics = [("eos_rate", METRICS.get("eos_rate"))]
    values = evaluate(metrics, cell)
    groups = prompt_groups([f"p{i}" for i in range(G)])
    ((lo, hi, _),) = confidence_intervals(
        metrics, cell, values, groups, n_boot=200, n_boot_corpus=20, rng=np.random.default_rng(0)
    ).values()
    want_lo = sps.beta.ppf(0.025, k, G - k + 1) if k else 0.0
    want_hi = sps.beta.ppf(0.975, k + 1, G - k) if k < G else 1.0
    assert values["eos_rate"] == pytest.approx(k / G)
    assert (lo, hi) == pytest.approx((want_lo, want_hi), rel=1e-9, abs=1e-12)
