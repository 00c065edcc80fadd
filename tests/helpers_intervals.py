"""Interval computations written out independently of the project's code, for the tests to compare with."""

from __future__ import annotations

import numpy as np


def bootstrap_t(units: np.ndarray, center: float, draws: int = 20000) -> tuple[float, float]:
    """A studentised bootstrap of Σ col 0 / Σ col 1 written out here: delta-method SE per replicate."""
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
    return center - q[1] * se, center - q[0] * se
