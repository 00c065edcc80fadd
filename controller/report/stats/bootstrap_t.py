"""The studentised bootstrap (bootstrap-t) of a statistic that is a function of summed per-unit statistics:
the delta-method standard error (`linearised_se`), the replicates through `scipy.stats.bootstrap`
(`studentized`), and each replicate studentised by its own SE or by the SE its estimate implies
(`spread_curve`). `intervals` applies it to a cell's additive metrics, `paired` to differences (a plain
metric's through its jackknife pseudo-values, `pseudo_interval`), `speed`, ratings and the judge to theirs;
and each keeps its intervals inside the values their statistic can take (`bounded`).
Nothing here knows any metric."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy import stats as sps

from controller.metrics import ratio

CI_LEVEL = 0.95
Z = NormalDist().inv_cdf((1 + CI_LEVEL) / 2)
MAX_K_PER_REPLICATE = 2  # statistics up to which a general combine's gradient is taken per replicate
NO_SPREAD = 1e-6  # a replicate's SE below this share of the sample's is none: numerical-gradient noise
PERCENTILES = [(1 - CI_LEVEL) / 2 * 100, (1 + CI_LEVEL) / 2 * 100]
SPREAD_BINS = 10  # equal-count groups of replicates over which `spread_curve` averages their SEs


def as_float(value: Any) -> float:
    """A metric value as a float; None, non-numbers and non-finite values become NaN."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


Bounds = tuple[float | None, float | None]  # (low, high) a statistic can take, None: unbounded on that side
UNBOUNDED: Bounds = (None, None)


def bounded(interval: tuple[float, float], bounds: Bounds) -> tuple[float, float]:
    """An interval with its ends moved inside `bounds`, the values its statistic can take (a metric's
    `Metric.bounds`, a rating's scale, a win rate's [0, 1]): no less likely to hold the truth, which is inside
    them, and no wider than they are. A bootstrap-t or a Student's t interval over a few skewed prompts reaches
    past them (a mean length of 8 prompts [-0.8, 35.7], BLEU [-0.06, 0.17], a difference of rep-3 shares
    [-19.4, 0.09]: docs/reports.md, "Inside the values a metric can take"). NaN stays NaN."""
    low, high = bounds
    lo, hi = interval
    if low is not None:
        lo, hi = max(lo, low), max(hi, low)
    if high is not None:
        lo, hi = min(lo, high), min(hi, high)
    return float(lo), float(hi)


def difference_bounds(bounds: Bounds) -> Bounds:
    """The values a difference of two values in `bounds` can take: (low − high, high − low) where both are
    given, else unbounded (two mean lengths differ by any amount)."""
    low, high = bounds
    return UNBOUNDED if low is None or high is None else (low - high, high - low)


def prompt_sums(stats: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(G, k): each prompt's summed per-generation statistics."""
    return np.stack([stats[list(items)].sum(axis=0) for items in groups])


def combine_many(combine: Callable, sums: np.ndarray) -> np.ndarray:
    """`combine` of every row of sums (..., k): the metric's values, NaN where empty."""
    flat = sums.reshape(-1, sums.shape[-1])
    return np.array([as_float(combine(row)) for row in flat.tolist()]).reshape(sums.shape[:-1])


def values_of(combine: Callable) -> Callable[[np.ndarray], np.ndarray]:
    """The metric of summed statistics (..., k) -> (...): vectorised for a plain ratio, else row by row."""
    if combine is ratio:

        def ratio_values(sums: np.ndarray) -> np.ndarray:
            with np.errstate(invalid="ignore", divide="ignore"):
                return sums[..., 0] / sums[..., 1]

        return ratio_values
    return lambda sums: combine_many(combine, sums)


def gradient(f: Callable[[np.ndarray], np.ndarray], sums: np.ndarray, *, is_ratio: bool = False) -> np.ndarray:
    """∂f/∂sums at each row of sums (..., k): exact for a ratio, else central differences."""
    if is_ratio:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.stack([1 / sums[..., 1], -sums[..., 0] / sums[..., 1] ** 2], axis=-1)
    out = np.empty(sums.shape)
    for j in range(sums.shape[-1]):
        h = 1e-6 * np.maximum(np.abs(sums[..., j]), 1.0)
        up, down = sums.copy(), sums.copy()
        up[..., j] += h
        down[..., j] -= h
        out[..., j] = (f(up) - f(down)) / (2 * h)
    return out


def linearised_se(
    units: np.ndarray,
    f: Callable,
    *,
    is_ratio: bool = False,
    at: np.ndarray | None = None,
    grad: Callable | None = None,
) -> np.ndarray:
    """Delta-method standard error of f(Σ units) over resampled units: units (..., G, k) -> (...).

    With d_i = ∇f(S) · x_i, the resampled sum's f has variance G · var(d) (the sum of G draws).
    The gradient is taken at each row's own sums (exact for a ratio; `grad(sums)` where given), or
    at `at` for all rows (the full sample's sums: one numerical gradient instead of one per replicate)."""
    G = units.shape[-2]
    sums = units.sum(axis=-2) if at is None else at
    g = gradient(f, sums, is_ratio=is_ratio) if grad is None else grad(sums)
    d = np.einsum("...gk,...k->...g", units, g)
    with np.errstate(invalid="ignore"):
        return np.sqrt(G * d.var(axis=-1, ddof=1))


def studentized(
    units: np.ndarray,
    f: Callable[[np.ndarray], np.ndarray],
    *,
    n_boot: int,
    rng: np.random.Generator,
    is_ratio: bool = False,
    center: float | None = None,
    t_floor: bool = False,
    grad: Callable[[np.ndarray], np.ndarray] | None = None,
    smooth: bool = False,
) -> tuple[float, float] | None:
    """Studentised (bootstrap-t) 95% interval of f(Σ units) over resampled units (rows of units).

    `f`: vectorised, sums (..., k) -> (...) (`values_of(combine)`); `is_ratio`: f is Σ col 0 / Σ col 1.

    `scipy.stats.bootstrap` resamples the unit indices (vectorised); each replicate gives
    t* = (f(S*) − f(S)) / se*, se* its delta-method standard error; the interval is
    [θ − q(0.975) · se, θ − q(0.025) · se] with q the quantiles of t*, θ = `center` or f(S).
    Where every unit is equal (se 0) the interval is [θ, θ]; with three units or fewer, or where fewer than
    half of the replicates are finite, θ ± t(G−1) · se (`from_replicates`). A replicate with no spread (se* 0, or
    within floating-point noise of it where the gradient is numerical) has no t; where more than
    2.5% of them have none (a rare event: rep-4 with one repeating prompt among 32), the t quantile
    on that side would be infinite, and the interval is the percentile bootstrap's, moved to θ (the
    report's rep-4 intervals had reached 10⁷ from such noise). `t_floor`: neither quantile inside
    Student's, q(0.975) ≥ t(G−1) and q(0.025) ≤ −t(G−1) (the jackknife's, see `paired.pseudo_interval`).
    `grad(sums)`: f's gradient, exact or cheap enough to take at every replicate's own sums.
    `smooth`: each replicate is studentised by the SE its estimate implies, not its own (`spread_curve`)."""
    value = float(f(units.sum(axis=0)[None])[0])
    theta = value if center is None else center
    se = float(linearised_se(units, f, is_ratio=is_ratio, grad=grad))
    if not (math.isfinite(value) and math.isfinite(se)):
        return None
    if se == 0:
        return theta, theta
    if too_few(len(units)):  # Student's t, no replicates drawn
        return from_replicates(np.empty(0), np.empty(0), value, theta, se, len(units), t_floor=t_floor)
    # the gradient at each replicate's sums (exact for a ratio, numerical for a few statistics); for a
    # combine of many statistics (BLEU's 11) once, at the sample's sums, which costs 2k + 1 calls, not B(2k + 1)
    per_replicate = is_ratio or grad is not None or units.shape[1] <= MAX_K_PER_REPLICATE
    fixed = None if per_replicate else units.sum(axis=0)

    def statistic(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        drawn = units[np.moveaxis(np.asarray(idx, dtype=np.intp), axis, -1)]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.stack([f(drawn.sum(axis=-2)), linearised_se(drawn, f, is_ratio=is_ratio, at=fixed, grad=grad)])

    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore")  # NaN replicates: handled below
        res = sps.bootstrap(
            (np.arange(len(units)),), statistic, n_resamples=n_boot, vectorized=True, method="percentile", rng=rng
        )
    estimates, spreads = np.asarray(res.bootstrap_distribution, dtype=float)
    return from_replicates(estimates, spreads, value, theta, se, len(units), t_floor=t_floor, smooth=smooth)


def spread_curve(estimates: np.ndarray, spreads: np.ndarray) -> Callable[[Any], np.ndarray]:
    """The SE as a function of the estimate, from bootstrap replicates: sorted by estimate in SPREAD_BINS
    equal-count groups, each group's mean SE at its median estimate, log-linear between, flat beyond (the
    variance function Tibshirani 1988 estimates from the bootstrap). A replicate's own SE, from a few skewed
    prompts, is far noisier than the one its estimate implies (one that draws none of the heavy prompts has
    a tiny SE, and a t far out); the curve keeps the SE's growth with the estimate, which gives the interval
    its skew, without that noise: rep_2 at 32 prompts 1.57x a normal interval's width with the true spread,
    now 1.36x, coverage 94.4 → 93.2% (docs/reports.md#confidence-intervals). One cell's additive metrics
    only: a paired difference keeps each replicate's own SE, as measured."""
    order = np.argsort(estimates, kind="stable")
    groups = [g for g in np.array_split(order, SPREAD_BINS) if len(g)]
    at = np.array([np.median(estimates[g]) for g in groups])
    level = np.log([np.mean(spreads[g]) for g in groups])
    at, first = np.unique(at, return_index=True)
    level = level[first]
    return lambda x: np.exp(np.interp(x, at, level))


def too_few(G: int) -> bool:
    """Whether G units are too few for a bootstrap-t: a replicate draws one unit alone G^(1 − G) of the time, more
    than a tail's share (G ≤ 3), so its replicates would be flat by construction (`from_replicates`)."""
    return float(G) ** (1 - G) > (1 - CI_LEVEL) / 2


def from_replicates(
    estimates: np.ndarray,
    spreads: np.ndarray,
    value: float,
    theta: float,
    se: float,
    G: int,
    *,
    t_floor: bool,
    smooth: bool = False,
) -> tuple[float, float]:
    """`studentized`'s interval from its replicates' estimates and delta-method SEs (see there).

    `smooth`: t* = (θ* − θ̂) / s(θ*) and the interval θ − q · s(θ̂), s the replicates' `spread_curve`; the
    floor stays Student's t(G − 1) times the sample's own SE.

    With too few units (`too_few`: G ≤ 3) the replicates' percentiles would be the range of the units (a tokens/s
    interval of two batches covered 50% of the time, of three 73%): Student's t(G − 1) instead."""
    q_t = float(sps.t.ppf((1 + CI_LEVEL) / 2, G - 1))
    if too_few(G):
        return theta - q_t * se, theta + q_t * se
    flat = ~(spreads > NO_SPREAD * se)  # no t: se* is 0 or floating-point noise (NaN counts too)
    if np.mean(flat & np.isfinite(estimates)) > (1 - CI_LEVEL) / 2:
        low, high = np.percentile(estimates[np.isfinite(estimates)], PERCENTILES)
        return float(low) + theta - value, float(high) + theta - value
    live = ~flat & np.isfinite(estimates)
    scale = se
    if smooth and live.sum() >= len(estimates) / 2:
        curve = spread_curve(estimates[live], spreads[live])
        ok, scale = (estimates[live] - value) / curve(estimates[live]), float(curve(value))
    else:
        ok = (estimates[~flat] - value) / spreads[~flat]
    ok = ok[np.isfinite(ok)]
    if len(ok) < len(estimates) / 2:  # too few units for a bootstrap-t (e.g. 2): Student's t instead
        return theta - q_t * se, theta + q_t * se
    q_low, q_high = (float(q) * scale for q in np.percentile(ok, PERCENTILES))
    if t_floor:
        q_low, q_high = min(q_low, -q_t * se), max(q_high, q_t * se)
    return theta - q_high, theta - q_low
