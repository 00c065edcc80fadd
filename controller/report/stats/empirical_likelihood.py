"""The empirical likelihood interval of a ratio of sums over prompts, or of a mean (Owen 1988; 2001, ch. 3).

The empirical likelihood ratio R(θ) reweights the prompts (weights w_i ≥ 0 summing to 1, the most likely such
reweighting) so that their mean of z_i = a_i − θ · b_i is 0; −2 log R(θ) = 2 Σ log(1 + λ z_i), λ the root of
Σ z_i / (1 + λ z_i) = 0. The interval is every θ with −2 log R(θ) under F(1, G − 1)'s 95% quantile (Owen's
small-sample calibration of the χ²(1) limit). It is not studentised: no SE, no replicates; its shape follows the
data's, so a sample skewed one way gets an interval that reaches further that way, by as much as its likelihood
says. Over a jackknifed metric's pseudo-values (b = 1: their mean) it is Jing, Yuan and Zhou's (2009, JASA)
jackknife empirical likelihood, built for non-linear statistics like distinct-n.

The plain version is 0 outside the convex hull of the z's (too short at few prompts); the adjusted one (Chen,
Variyath and Abraham 2008) adds one pseudo-observation −max(1, log(G) / 2) · z̄ and is defined for every θ: the
report's (`adjusted=True`). distinct-n's interval since 2026-12-06, on its logit pseudo-values: measured against
the skew-corrected Student's t on both of the benchmarks' processes (docs/reports.md, "Empirical likelihood").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import optimize
from scipy import stats as sps

from controller.report.stats.bootstrap_t import CI_LEVEL

_DOUBLINGS = 60  # the adjusted statistic is bounded as θ runs off (it is scale invariant): how far to look


def el_statistic(z: np.ndarray) -> float:
    """−2 log of the empirical likelihood ratio that the mean of z is 0; inf outside z's convex hull."""
    if not z.min() < 0 < z.max():
        return math.inf if np.any(z) else 0.0
    z = z / float(np.max(np.abs(z)))  # R is the same at any scale of z; at this one λ's range is about 1
    low, high = -1 / z.max(), -1 / z.min()  # λ where every weight 1 / (G (1 + λ z_i)) stays positive
    pad = 1e-10 * (high - low)
    lam = optimize.brentq(lambda x: float(np.sum(z / (1 + x * z))), low + pad, high - pad, xtol=1e-14, maxiter=500)
    return float(2 * np.sum(np.log1p(lam * z)))


def ratio_interval(
    a: np.ndarray, b: np.ndarray, *, adjusted: bool = True, level: float = CI_LEVEL
) -> tuple[float, float] | None:
    """The empirical likelihood interval of Σa / Σb (b ≥ 0, Σb > 0), the adjusted or the plain one; an end the
    adjusted statistic never reaches is ±inf (only at very few prompts: bounded from 8). None without spread
    information (fewer than two prompts, a NaN or an inf)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    G = len(a)
    if G < 2 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))) or b.sum() <= 0:
        return None
    estimate = float(a.sum() / b.sum())
    ratios = a[b > 0] / b[b > 0]
    if float(np.ptp(a - estimate * b)) == 0:  # every prompt on the estimate: no spread to draw an interval from
        return estimate, estimate
    crit, boost = float(sps.f.ppf(level, 1, G - 1)), max(1.0, math.log(G) / 2)

    def excess(theta: float) -> float:
        z = a - theta * b
        return el_statistic(np.append(z, -boost * z.mean()) if adjusted else z) - crit

    span = max(float(np.ptp(ratios)), 1e-12 * max(1.0, abs(estimate)))
    low, high = float(ratios.min()), float(ratios.max())
    if not adjusted:
        return _hull_end(excess, estimate, low), _hull_end(excess, estimate, high)
    return _open_end(excess, estimate, low, -span), _open_end(excess, estimate, high, span)


def mean_interval(pseudo: np.ndarray, center: float) -> tuple[float, float] | None:
    """The adjusted empirical likelihood interval of the pseudo-values' mean, moved to sit on `center` (the
    metric's value over every generation, as `intervals.skew_corrected` is); None where it has none."""
    pseudo = np.asarray(pseudo, dtype=float)
    interval = ratio_interval(pseudo, np.ones(len(pseudo)))
    if interval is None or not math.isfinite(center):
        return None
    shift = center - float(pseudo.mean())
    return interval[0] + shift, interval[1] + shift


def _hull_end(excess: Callable[[float], float], estimate: float, edge: float) -> float:
    """The plain EL's end towards `edge`: R is 0 past the convex hull, so the end lies inside it, or is its edge."""
    inside = edge + (estimate - edge) * 1e-9
    return optimize.brentq(excess, estimate, inside, xtol=1e-12) if excess(inside) > 0 else edge


def _open_end(excess: Callable[[float], float], estimate: float, edge: float, step: float) -> float:
    """The adjusted EL's end past `edge` (`step`: ± the ratios' spread), doubling outwards to bracket it; ±inf where
    its statistic, bounded as θ runs off (it is scale invariant), never reaches the quantile."""
    far = (max(edge, estimate) if step > 0 else min(edge, estimate)) + step
    for _ in range(_DOUBLINGS):
        if excess(far) > 0:
            return optimize.brentq(excess, estimate, far, xtol=1e-12 * max(1.0, abs(far)))
        far = estimate + 2 * (far - estimate)
    return math.copysign(math.inf, step)
