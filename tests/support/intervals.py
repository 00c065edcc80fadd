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


def paired_bootstrap_t(a: np.ndarray, b: np.ndarray, draws: int = 20000) -> tuple[float, float]:
    """The studentised bootstrap of (Σ a0 / Σ a1) − (Σ b0 / Σ b1) over prompts (rows of a and b drawn
    together), written out here: each replicate's delta-method SE at its own sums, neither quantile
    inside Student's t(G − 1)."""
    from scipy.stats import t as student

    G = len(a)

    def est_se(x, y):  # (..., G, 2) each
        ra, rb = x[..., 0].sum(-1) / x[..., 1].sum(-1), y[..., 0].sum(-1) / y[..., 1].sum(-1)
        d = (x[..., 0] - ra[..., None] * x[..., 1]) / x[..., 1].sum(-1)[..., None]
        d -= (y[..., 0] - rb[..., None] * y[..., 1]) / y[..., 1].sum(-1)[..., None]
        return ra - rb, np.sqrt(G * d.var(-1, ddof=1))

    theta, se = est_se(a, b)
    idx = np.random.default_rng(0).integers(0, G, (draws, G))
    with np.errstate(invalid="ignore", divide="ignore"):  # a replicate of equal rows: no t
        r, s = est_se(a[idx], b[idx])
        t = (r - theta) / s
    q_low, q_high = np.percentile(t[np.isfinite(t)], [2.5, 97.5])
    q = student.ppf(0.975, G - 1)
    return theta - max(q_high, q) * se, theta - min(q_low, -q) * se
