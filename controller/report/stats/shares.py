"""The bootstrap interval of a share (a metric declared `unit_interval`): inside [0, 1], and exact where
every generation is alike; and any [0, 1] metric's where every prompt sits at its bound (`nothing_seen`).

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


def alike_binary(stats: np.ndarray) -> bool:
    """Every generation contributes [b, 1] with the same b, 0 or 1: a share with nothing to resample."""
    if stats.ndim != 2 or stats.shape[1] != 2 or len(stats) == 0:
        return False
    b = stats[:, 0]
    return bool(np.all(stats[:, 1] == 1) and np.all(b == b[0]) and b[0] in (0.0, 1.0))


def binary_once(stats: np.ndarray, n_prompts: int) -> bool:
    """One generation per prompt, each contributing [0 or 1, 1]: a binomial count of n_prompts trials."""
    if stats.ndim != 2 or stats.shape[1] != 2 or len(stats) != n_prompts or n_prompts == 0:
        return False
    return bool(np.all(stats[:, 1] == 1) and np.all((stats[:, 0] == 0) | (stats[:, 0] == 1)))


def share_interval(
    interval: tuple[float, float] | None, stats: np.ndarray, n_prompts: int, level: float
) -> tuple[float, float] | None:
    """`interval` clipped to [0, 1] (a share's truth is there); the exact Clopper–Pearson `level` interval
    of the successes in `n_prompts` trials where every generation is alike (see `alike_binary`: 0 or all),
    or where each prompt has one 0/1 generation (`binary_once`: any count)."""
    if n_prompts >= 1 and (alike_binary(stats) or binary_once(stats, n_prompts)):
        k = int(stats[0, 0]) * n_prompts if alike_binary(stats) else int(stats[:, 0].sum())
        ci = sps.binomtest(k, n_prompts).proportion_ci(confidence_level=level, method="exact")
        return float(ci.low), float(ci.high)
    if interval is None:
        return None
    return nothing_seen(
        (float(np.clip(interval[0], 0.0, 1.0)), float(np.clip(interval[1], 0.0, 1.0))), n_prompts, level
    )


def nothing_seen(interval: tuple[float, float] | None, n_prompts: int, level: float) -> tuple[float, float] | None:
    """A [0, 1] metric's interval of no width at 0 or 1 — every prompt at the bound: no repeated n-gram in any
    generation (rep-n 0), every n-gram unique (distinct-n 1), no n-gram shared (self-BLEU 0) — is the exact
    Clopper–Pearson `level` interval of no event in `n_prompts` trials, [0, 1 − ((1 − level) / 2)^(1/G)] (or the
    same from 1): a share of prompts that leave the bound, each by at most 1, bounds the metric (where their
    lengths are alike), and G prompts of which none did cannot rule out a share of up to that. Not [θ, θ], which
    claims certainty from a sample that cannot show what it did not draw (`alike_binary`'s argument, for any
    metric in [0, 1])."""
    if interval is None or n_prompts < 1 or interval[0] != interval[1] or interval[0] not in (0.0, 1.0):
        return interval
    ci = sps.binomtest(0 if interval[0] == 0.0 else n_prompts, n_prompts).proportion_ci(
        confidence_level=level, method="exact"
    )
    return float(ci.low), float(ci.high)
