"""Interval computations written out independently of the project's code, for the tests to compare with."""

from __future__ import annotations

import numpy as np


def bootstrap_t(
    units: np.ndarray, center: float, draws: int = 20000, t_floor: bool = False, smooth: bool = False
) -> tuple[float, float]:
    """A studentised bootstrap of Σ col 0 / Σ col 1 written out here: delta-method SE per replicate;
    `t_floor`: neither side inside Student's t(G − 1) times the sample's SE (the jackknife's); `smooth`: each
    replicate studentised by the SE its estimate implies (`smoothed`), the interval's scale that SE at θ."""
    G = len(units)

    def est_se(u):  # u: (..., G, 2)
        a, b = u[..., 0].sum(-1), u[..., 1].sum(-1)
        r = a / b
        d = (u[..., 0] - r[..., None] * u[..., 1]) / b[..., None]
        return r, np.sqrt(G * d.var(-1, ddof=1))

    theta, se = est_se(units)
    idx = np.random.default_rng(0).integers(0, G, (draws, G))
    r, s = est_se(units[idx])
    scale = se
    if smooth:
        curve = smoothed(r, s)
        s, scale = curve(r), curve(theta)
    t = (r - theta) / s
    q = np.percentile(t[np.isfinite(t)], [2.5, 97.5]) * scale
    if t_floor:
        from scipy.stats import t as student

        floor = student.ppf(0.975, G - 1) * se
        q = [min(q[0], -floor), max(q[1], floor)]
    return center - q[1], center - q[0]


def smoothed(r: np.ndarray, s: np.ndarray, parts: int = 10):
    """The replicates' SE as a function of their estimate: sorted by estimate, cut in `parts` groups of
    (nearly) equal size, each group's mean SE at its median estimate, log-linear between, flat outside."""
    order = np.argsort(r)
    knots = sorted((float(np.median(r[g])), float(np.log(np.mean(s[g])))) for g in np.array_split(order, parts))
    xs, ys = zip(*dict(knots).items())
    return lambda x: np.exp(np.interp(x, xs, ys))


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


def edgeworth_t(pseudo: np.ndarray, center: float) -> tuple[float, float]:
    """Student's t(G − 1) interval of the mean of `pseudo` around `center`, its quantiles moved by the one-term
    Edgeworth expansion of the studentised mean, −γ (2q² + 1) / (6√G), γ the adjusted sample skewness
    √(G(G − 1)) / (G − 2) · m₃ / m₂^1.5, and neither side inside Student's, written out here."""
    from scipy.stats import t as student

    G = len(pseudo)
    dev = pseudo - pseudo.mean()
    m2, m3 = np.mean(dev**2), np.mean(dev**3)
    gamma = np.sqrt(G * (G - 1)) / (G - 2) * m3 / m2**1.5
    se = np.sqrt(np.sum(dev**2) / (G - 1) / G)
    q = student.ppf(0.975, G - 1)
    q_high, q_low = q - gamma * (2 * q**2 + 1) / (6 * np.sqrt(G)), -q - gamma * (2 * q**2 + 1) / (6 * np.sqrt(G))
    return center - max(q_high, q) * se, center - min(q_low, -q) * se


def empirical_likelihood_mean(values: np.ndarray, center: float, adjusted: bool = True) -> tuple[float, float]:
    """The 95% empirical likelihood interval of the mean of `values`, written out here from the dual: −2 log R(μ) =
    max over λ of 2 Σ log(1 + λ z_i), z = values − μ (and, adjusted, the pseudo-observation −max(1, log(G)/2) · z̄),
    maximised numerically; the ends found by bisection where it meets F(1, G − 1)'s 95% quantile; moved so the mean
    sits at `center`."""
    from scipy.optimize import minimize_scalar
    from scipy.stats import f as fisher

    G = len(values)
    crit, boost = fisher.ppf(0.95, 1, G - 1), max(1.0, np.log(G) / 2)

    def minus_two_log_r(mu: float) -> float:
        z = values - mu
        if adjusted:
            z = np.append(z, -boost * z.mean())
        if z.min() >= 0 or z.max() <= 0:
            return np.inf
        low, high = -1 / z.max(), -1 / z.min()
        pad = 1e-12 * (high - low)
        best = minimize_scalar(lambda lam: -np.sum(np.log1p(lam * z)), bounds=(low + pad, high - pad),
                               method="bounded", options={"xatol": 1e-13})  # fmt: skip
        return -2 * best.fun

    def bisect(inside: float, outside: float) -> float:
        for _ in range(200):
            mid = (inside + outside) / 2
            inside, outside = (mid, outside) if minus_two_log_r(mid) < crit else (inside, mid)
        return (inside + outside) / 2

    mean, span = values.mean(), np.ptp(values)
    low_out, high_out = mean - span, mean + span
    while minus_two_log_r(low_out) < crit:
        low_out -= span
    while minus_two_log_r(high_out) < crit:
        high_out += span
    shift = center - mean
    return bisect(mean, low_out) + shift, bisect(mean, high_out) + shift
