"""Interval computations written out independently of the project's code, for the tests to compare with."""

from __future__ import annotations

import numpy as np


def bootstrap_t(units: np.ndarray, center: float, draws: int = 20000, t_floor: bool = False) -> tuple[float, float]:
    """A studentised bootstrap of Σ col 0 / Σ col 1 written out here: delta-method SE per replicate;
    `t_floor`: neither quantile inside Student's t(G − 1) (the jackknife's)."""
    G = len(units)

    def est_se(u):  # u: (..., G, 2)
        a, b = u[..., 0].sum(-1), u[..., 1].sum(-1)
        r = a / b
        d = (u[..., 0] - r[..., None] * u[..., 1]) / b[..., None]
        return r, np.sqrt(G * d.var(-1, ddof=1))

    theta, se = est_se(units)
    idx = np.random.default_rng(0).integers(0, G, (draws, G))
    r, s = est_se(units[idx])
    t = (r - theta) / s
    q = np.percentile(t[np.isfinite(t)], [2.5, 97.5])
    if t_floor:
        from scipy.stats import t as student

        q = [min(q[0], -student.ppf(0.975, G - 1)), max(q[1], student.ppf(0.975, G - 1))]
    return center - q[1] * se, center - q[0] * se
