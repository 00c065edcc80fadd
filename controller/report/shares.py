"""The bootstrap interval of a share (a metric declared `unit_interval`): inside [0, 1], and exact where
every generation is alike.

A bootstrap over prompts cannot see past its sample: where no generation of a cell ended at EOS,
every replicate's eos_rate is 0 and the interval was [0, 0], as if the cell had shown that no
generation ever ends. For a share counted once per generation (each generation contributes
[0 or 1, 1]), the first generation of each of the G prompts is an independent draw of the
population's share p, so "none of the G" has probability (1 − p)^G: the exact Clopper–Pearson
interval of 0 (or G) successes in G trials, [0, 1 − 0.025^(1/G)], holds p with 95% (or more:
the other seeds of a prompt add less than independent draws would, and they are not counted).
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


def share_interval(
    interval: tuple[float, float] | None, stats: np.ndarray, n_prompts: int, level: float
) -> tuple[float, float] | None:
    """`interval` clipped to [0, 1] (a share's truth is there); where every generation is alike (see
    `alike_binary`), the exact Clopper–Pearson `level` interval of 0 or all successes in `n_prompts` trials."""
    if alike_binary(stats) and n_prompts >= 1:
        k = int(stats[0, 0]) * n_prompts
        ci = sps.binomtest(k, n_prompts).proportion_ci(confidence_level=level, method="exact")
        return float(ci.low), float(ci.high)
    if interval is None:
        return None
    return float(np.clip(interval[0], 0.0, 1.0)), float(np.clip(interval[1], 0.0, 1.0))
