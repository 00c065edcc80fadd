"""The bootstrap interval of a share (a metric declared `unit_interval`): inside [0, 1], and exact where
every generation is alike; and any [0, 1] metric's where every prompt sits at one value, a bound or not
(`within_scale`).

A bootstrap over prompts cannot see past its sample: where no generation of a cell ended at EOS,
every replicate's eos_rate is 0 and the interval was [0, 0], as if the cell had shown that no
generation ever ends. For a share counted once per generation (each generation contributes
[0 or 1, 1]), the first generation of each of the G prompts is an independent draw of the
population's share p, so "none of the G" has probability (1 − p)^G: the exact Clopper–Pearson
interval of 0 (or G) successes in G trials, [0, 1 − 0.025^(1/G)], holds p with 95% (or more:
the other seeds of a prompt add less than independent draws would, and they are not counted).

With one generation per prompt (a one-seed sweep: greedy's eos_rate, a task's exact_match) the same
holds for any count: the G outcomes are independent draws of p, their count is Binomial(G, p), and the
exact interval is the one to give. The bootstrap-t of a rare event had covered 85% at 128 prompts
(bench_coverage, eos_rate at 2.3%: three or four events a cell; docs/reports.md). So it is wherever each prompt
holds one 0/1 outcome of the same weight (`binary_prompts`), however many generations it took: pass@k of k samples
(right if any is) and maj@k (the vote is right or not) are such a share of prompts by construction; their
bootstrap-t had covered pass@8 87.8% at 16 prompts and 91.8% at 32, and maj@8 as well but 1.16 times as wide at 16
(bench_accuracy.py; docs/reports.md, "Task accuracy, measured").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

from controller.report.stats.bootstrap_t import bounded

WIDTH_TOL = 1e-9  # an interval narrower than this share of its scale has no width: the replicates' float noise


def binary_prompts(sums: np.ndarray) -> tuple[int, int] | None:
    """(successes, trials) where every prompt that counts holds one 0/1 outcome of the same weight: its sums (v, w),
    w > 0 the same for each and v 0 or w (one 0/1 generation a prompt; pass@k of k samples and maj@k, whose rows of
    (v / n, 1 / n) sum to (0 or 1, 1)), a prompt with w = 0 not counted (pass@k of fewer than k); else None."""
    if sums.ndim != 2 or sums.shape[1] != 2:
        return None
    counted = sums[sums[:, 1] > 0]
    if len(counted) == 0:
        return None
    w = counted[:, 1]
    share = counted[:, 0] / w
    right = np.isclose(share, 1.0, rtol=0, atol=1e-9)
    if not (np.allclose(w, w[0], rtol=1e-9, atol=0) and np.all(right | np.isclose(share, 0.0, rtol=0, atol=1e-9))):
        return None
    return int(right.sum()), len(counted)


def share_interval(
    interval: tuple[float, float] | None, sums: np.ndarray, level: float, *, of_ratio: bool, outcomes: bool = False
) -> tuple[float, float] | None:
    """A bootstrap share's interval from its prompts' sums (G, k): where the share is a ratio Σ v / Σ w (`of_ratio`)
    the exact Clopper–Pearson `level` interval of the successes in the trials where each prompt holds one 0/1
    outcome of the same weight (`binary_prompts`); for a share of 0/1 outcomes (`outcomes`: `Metric.outcomes`, a
    count of right answers of a prompt's answers) with several a prompt, `korn_graubard`'s; else `within_scale`'s
    (which is the exact one of 0 or all where every generation is alike: no event, or no non-event, in any
    prompt)."""
    binary = binary_prompts(sums) if of_ratio else None
    if binary is not None:
        return exact(*binary, level)
    clustered = korn_graubard(sums, level) if of_ratio and outcomes else None
    return clustered if clustered is not None else within_scale(interval, len(sums), level)


def outcome_counts(sums: np.ndarray, sizes: Sequence[int]) -> np.ndarray | None:
    """A per-prompt share's sums (v, 1), v a prompt's share of its n right outcomes (pass@1's c / n; `sizes`: each
    prompt's generations), as the counts (v·n, n) of its outcomes, a prompt not counted (0, 0): exact_match's sums of
    the same answers. None unless every counted prompt has the same n (else the value, a mean of shares, is not the
    ratio of the counts)."""
    n = np.asarray(sizes, dtype=float)
    counted = sums[:, 1] > 0
    if len(n) != len(sums) or not counted.any() or not np.all(n[counted] == n[counted][0]):
        return None
    return np.column_stack([np.where(counted, sums[:, 0] * n, 0.0), np.where(counted, n, 0.0)])


def korn_graubard(sums: np.ndarray, level: float, *, df: bool = False) -> tuple[float, float] | None:
    """Korn and Graubard's (1998) interval of a share of 0/1 outcomes nested in prompts (the clusters), from the
    prompts' sums (right, answers): the exact Clopper–Pearson interval at the effective number of answers
    n* = p(1 − p) / SE², the SE the delta-method one of the ratio over prompts, and n* at most the N answers (answers
    drawn independently given their prompt can only add variance to N independent draws: the design effect is at
    least 1, so the interval is never narrower than the N answers' own). Where a few hard prompts carry the misses,
    the bootstrap-t of a sample that drew none of them sat near 1 and covered 86–92% at 16 and 32 prompts; this one
    keeps the N answers' binomial width (docs/reports.md, "Task accuracy, measured"). `df`: n* shrunk by
    (z / t(G − 1))², the published degrees-of-freedom correction, measured and not taken (it over-covered at 16
    prompts). None where p is 0 or 1 or every prompt has the same share (SE 0): `within_scale`'s exact interval of
    none seen off it."""
    counted = sums[sums[:, 1] > 0]
    G = len(counted)
    if G < 2:
        return None
    v, w = counted[:, 0], counted[:, 1]
    N = float(w.sum())
    p = float(v.sum()) / N
    se = float(np.sqrt(np.sum((v - p * w) ** 2) / (G * (G - 1)))) / (N / G)
    if not (0 < p < 1 and se > 0):
        return None
    n = min(N, p * (1 - p) / se**2)
    if df:
        n *= (sps.norm.ppf((1 + level) / 2) / sps.t.ppf((1 + level) / 2, G - 1)) ** 2
    x, a = p * n, (1 - level) / 2
    return float(sps.beta.ppf(a, x, n - x + 1)), float(sps.beta.ppf(1 - a, x + 1, n - x))


def within_scale(
    interval: tuple[float, float] | None, n_prompts: int, level: float, scale: tuple[float, float] = (0.0, 1.0)
) -> tuple[float, float] | None:
    """A [0, 1] metric's interval (bootstrap or jackknife) clipped to [0, 1], where its truth is; and where it has no
    width at 0 or 1 — every prompt at the bound: no repeated n-gram in any generation (rep-n 0), every n-gram unique
    (distinct-n 1), no n-gram shared (self-BLEU 0), no generation at EOS (eos_rate 0) — the exact interval of no
    event in `n_prompts` trials, [0, 1 − ((1 − level) / 2)^(1/G)] (or the same from 1): a share of prompts that leave
    the bound, each by at most 1, bounds the metric (where their lengths are alike), and G prompts of which none did
    cannot rule out a share of up to that. Not [θ, θ], which claims certainty from a sample that cannot show what it
    did not draw. So wherever every prompt sits at one value v inside (every pair a tie: a win rate of ½), the share
    that could be off it, u, moves the mean by at most u towards either end: [v − v·u, v + (1 − v)·u]. `scale`: the
    same for a mean of scores on another bounded scale (a rating's 1-5, a judge's grade's 1-10: every item rated 5 is
    not a mean of 5 for certain)."""
    if interval is None:
        return None
    bottom, top = scale
    low, high = bounded(interval, scale)
    if n_prompts >= 1 and math.isclose(low, high, rel_tol=0, abs_tol=WIDTH_TOL * (top - bottom)):
        v = next((end for end in (low, high) if end in scale), (low + high) / 2)  # a bound, where one end is it
        off = exact(0, n_prompts, level)[1]  # none of n_prompts seen off the value: up to this share could be
        return v - (v - bottom) * off, v + (top - v) * off
    return low, high


def exact(successes: int, trials: int, level: float) -> tuple[float, float]:
    """The exact Clopper–Pearson `level` interval of `successes` in `trials`."""
    ci = sps.binomtest(successes, trials).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)
