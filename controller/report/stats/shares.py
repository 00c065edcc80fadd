"""The bootstrap interval of a share (a metric declared `unit_interval`): inside [0, 1], and exact where
every generation is alike; and any [0, 1] metric's where every prompt sits at its bound (`within_unit`).

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
(bench_coverage, eos_rate at 2.3%: three or four events a cell; docs/reports.md).
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

from controller.report.stats.bootstrap_t import bounded


def binary_once(stats: np.ndarray, n_prompts: int) -> bool:
    """One generation per prompt, each contributing [0 or 1, 1]: a binomial count of n_prompts trials."""
    if stats.ndim != 2 or stats.shape[1] != 2 or len(stats) != n_prompts or n_prompts == 0:
        return False
    return bool(np.all(stats[:, 1] == 1) and np.all((stats[:, 0] == 0) | (stats[:, 0] == 1)))


def share_interval(
    interval: tuple[float, float] | None, stats: np.ndarray, n_prompts: int, level: float
) -> tuple[float, float] | None:
    """A bootstrap share's interval: the exact Clopper–Pearson `level` interval of the successes in `n_prompts`
    trials where each prompt has one 0/1 generation (`binary_once`), else `within_unit`'s (which is the exact one
    of 0 or all where every generation is alike: no event, or no non-event, in any prompt)."""
    if n_prompts >= 1 and binary_once(stats, n_prompts):
        return exact(int(stats[:, 0].sum()), n_prompts, level)
    return within_unit(interval, n_prompts, level)


def within_unit(interval: tuple[float, float] | None, n_prompts: int, level: float) -> tuple[float, float] | None:
    """A [0, 1] metric's interval (bootstrap or jackknife) clipped to [0, 1], where its truth is; and where it has no
    width at 0 or 1 — every prompt at the bound: no repeated n-gram in any generation (rep-n 0), every n-gram unique
    (distinct-n 1), no n-gram shared (self-BLEU 0), no generation at EOS (eos_rate 0) — the exact interval of no
    event in `n_prompts` trials, [0, 1 − ((1 − level) / 2)^(1/G)] (or the same from 1): a share of prompts that leave
    the bound, each by at most 1, bounds the metric (where their lengths are alike), and G prompts of which none did
    cannot rule out a share of up to that. Not [θ, θ], which claims certainty from a sample that cannot show what it
    did not draw."""
    if interval is None:
        return None
    low, high = bounded(interval, (0.0, 1.0))
    if n_prompts >= 1 and low == high and low in (0.0, 1.0):
        return exact(0 if low == 0.0 else n_prompts, n_prompts, level)
    return low, high


def exact(successes: int, trials: int, level: float) -> tuple[float, float]:
    """The exact Clopper–Pearson `level` interval of `successes` in `trials`."""
    ci = sps.binomtest(successes, trials).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)
