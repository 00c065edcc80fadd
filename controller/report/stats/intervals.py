"""Cell metrics and their 95% confidence intervals over prompt resamples.

`evaluate` computes every requested metric of one cell (NaN where it does not apply);
`confidence_intervals` resamples prompts (all seeds of a prompt together), by the
method each metric declares when it registers (`Metric.interval`, see
`controller.metrics`):

- "bootstrap" (additive metrics): the studentised bootstrap (bootstrap-t) over prompts, through
  `scipy.stats.bootstrap`, vectorised: scipy resamples prompt indices, a replicate's value is
  `combine` of the drawn prompts' summed per-generation statistics (exactly the metric on those
  generations), studentised by the standard error its value implies: the replicates' delta-method
  SEs smoothed against their values (`spread_curve`); neither side inside Student's;
- "jackknife" (plain corpus metrics): the delete-one-prompt jackknife, from the metric's own
  exact `leave_one_out` where it declares one, else `fn` on the cell without each prompt;
  θ − q · SE with the t quantiles q from a bootstrap of the pseudo-values, never inside Student's;
- "half-sample": the delete-half jackknife, `fn` on halves of the prompts.

Nothing here knows any metric. docs/reports.md explains the methods and their measured coverage.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy import stats as sps

from controller.metrics import CellData, Metric, column_sums, ratio
from controller.report.stats.shares import share_interval

CI_LEVEL = 0.95
Z = NormalDist().inv_cdf((1 + CI_LEVEL) / 2)
MAX_K_PER_REPLICATE = 2  # statistics up to which a general combine's gradient is taken per replicate
NO_SPREAD = 1e-6  # a replicate's SE below this share of the sample's is none: numerical-gradient noise
PERCENTILES = [(1 - CI_LEVEL) / 2 * 100, (1 + CI_LEVEL) / 2 * 100]
SPREAD_BINS = 10  # equal-count groups of replicates over which `spread_curve` averages their SEs


def _num(value: Any) -> float:
    """A metric value as a float; None, non-numbers and non-finite values become NaN."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def applicable(metric: Metric, cell: CellData, *, reference_row: bool = False) -> bool:
    """False where a metric cannot apply: then its value is empty without calling it."""
    if reference_row and (metric.needs_references or metric.needs_model):
        return False
    if metric.needs_references and not any(r for r in cell.references):
        return False
    return bool(cell.texts)


def evaluate(
    metrics: list[tuple[str, Metric]], cell: CellData, *, reference_row: bool = False, stats: dict | None = None
) -> dict[str, float]:
    """Every metric of one cell: a float, NaN where it does not apply.

    `stats`, if given, keeps each additive metric's per-generation statistics for its interval
    (the value is `combine` of their column sums, exactly what `fn` computes)."""
    out = {}
    for name, m in metrics:
        if not applicable(m, cell, reference_row=reference_row):
            out[name] = math.nan
        elif m.additive and stats is not None:
            stats[name] = st = m.stats(cell)
            out[name] = math.nan if st is None else _num(m.combine(column_sums(st)))
        else:
            out[name] = _num(m.fn(cell))
    return out


# -- the bootstrap of additive metrics ------------------------------------------------------


def prompt_sums(stats: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(G, k): each prompt's summed per-generation statistics."""
    return np.stack([stats[list(items)].sum(axis=0) for items in groups])


def combine_many(combine: Callable, sums: np.ndarray) -> np.ndarray:
    """`combine` of every row of sums (..., k): the metric's values, NaN where empty."""
    flat = sums.reshape(-1, sums.shape[-1])
    return np.array([_num(combine(row)) for row in flat.tolist()]).reshape(sums.shape[:-1])


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
    Where every unit is equal (se 0) the interval is [θ, θ]; where fewer than half of the
    replicates are finite (too few units), θ ± t(G−1) · se. A replicate with no spread (se* 0, or
    within floating-point noise of it where the gradient is numerical) has no t; where more than
    2.5% of them have none (a rare event: rep-4 with one repeating prompt among 32), the t quantile
    on that side would be infinite, and the interval is the percentile bootstrap's, moved to θ (the
    report's rep-4 intervals had reached 10⁷ from such noise). `t_floor`: neither quantile inside
    Student's, q(0.975) ≥ t(G−1) and q(0.025) ≤ −t(G−1) (the jackknife's, see `pseudo_interval`).
    `grad(sums)`: f's gradient, exact or cheap enough to take at every replicate's own sums.
    `smooth`: each replicate is studentised by the SE its estimate implies, not its own (`spread_curve`)."""
    value = float(f(units.sum(axis=0)[None])[0])
    theta = value if center is None else center
    se = float(linearised_se(units, f, is_ratio=is_ratio, grad=grad))
    if not (math.isfinite(value) and math.isfinite(se)):
        return None
    if se == 0:
        return theta, theta
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
    return _from_replicates(estimates, spreads, value, theta, se, len(units), t_floor=t_floor, smooth=smooth)


def spread_curve(estimates: np.ndarray, spreads: np.ndarray) -> Callable[[Any], np.ndarray]:
    """The SE as a function of the estimate, from bootstrap replicates: sorted by estimate in SPREAD_BINS
    equal-count groups, each group's mean SE at its median estimate, log-linear between, flat beyond (the
    variance function Tibshirani 1988 estimates from the bootstrap). A replicate's own SE, from a few skewed
    prompts, is far noisier than the one its estimate implies (one that draws none of the heavy prompts has
    a tiny SE, and a t far out); the curve keeps the SE's growth with the estimate, which gives the interval
    its skew, without that noise: rep_2 at 32 prompts 1.57x a normal interval's width with the true spread,
    now 1.36x, coverage 94.4 → 93.2% (docs/reports.md#confidence-intervals). One cell's additive metrics
    only: the jackknife's pseudo-values and a paired difference keep each replicate's own SE, as measured."""
    order = np.argsort(estimates, kind="stable")
    groups = [g for g in np.array_split(order, SPREAD_BINS) if len(g)]
    at = np.array([np.median(estimates[g]) for g in groups])
    level = np.log([np.mean(spreads[g]) for g in groups])
    at, first = np.unique(at, return_index=True)
    level = level[first]
    return lambda x: np.exp(np.interp(x, at, level))


def _from_replicates(
    estimates: np.ndarray, spreads: np.ndarray, value: float, theta: float, se: float, G: int, *, t_floor: bool,
    smooth: bool = False,
) -> tuple[float, float]:  # fmt: skip
    """`studentized`'s interval from its replicates' estimates and delta-method SEs (see there).

    `smooth`: t* = (θ* − θ̂) / s(θ*) and the interval θ − q · s(θ̂), s the replicates' `spread_curve`; the
    floor stays Student's t(G − 1) times the sample's own SE."""
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
    q_t = float(sps.t.ppf((1 + CI_LEVEL) / 2, G - 1))
    if len(ok) < len(estimates) / 2:  # too few units for a bootstrap-t (e.g. 2): Student's t instead
        return theta - q_t * se, theta + q_t * se
    q_low, q_high = (float(q) * scale for q in np.percentile(ok, PERCENTILES))
    if t_floor:
        q_low, q_high = min(q_low, -q_t * se), max(q_high, q_t * se)
    return theta - q_high, theta - q_low


def bootstrap(
    metric: Metric,
    cell: CellData,
    groups: Sequence[Sequence[int]],
    *,
    n_boot: int,
    rng: np.random.Generator,
    keep: dict | None = None,
    stats: np.ndarray | None = None,
) -> tuple[float, float] | None:
    """Studentised bootstrap interval of an additive metric over prompts, from its per-generation statistics,
    each replicate studentised by the SE its estimate implies (`spread_curve`)."""
    stats = metric.stats(cell) if stats is None else stats
    if stats is None:
        return None
    per_prompt = prompt_sums(stats, groups)
    if keep is not None:
        keep[metric.name] = ("sums", per_prompt)
    f, is_ratio = values_of(metric.combine), metric.combine is ratio
    interval = studentized(per_prompt, f, n_boot=n_boot, rng=rng, is_ratio=is_ratio, t_floor=True, smooth=True)
    if metric.unit_interval:  # a share: inside [0, 1]; exact where every generation is alike
        return share_interval(interval, stats, len(groups), CI_LEVEL)
    return interval


# -- jackknives of the plain corpus metrics -------------------------------------------------


def leave_one_out(metric: Metric, cell: CellData, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """The metric without each prompt in turn: its exact `leave_one_out`, else `fn` on each subset."""
    if metric.leave_one_out is not None:
        return np.asarray(metric.leave_one_out(cell, groups), dtype=float)
    out = []
    for g in range(len(groups)):
        keep = [i for h, items in enumerate(groups) if h != g for i in items]
        out.append(_num(metric.fn(cell.subset(keep))))
    return np.array(out)


def jackknife_se(values: np.ndarray) -> float:
    """Delete-one jackknife standard error of len(values) leave-one-out values (NaN if any is NaN)."""
    G = len(values)
    return math.sqrt((G - 1) / G * float(np.sum((values - values.mean()) ** 2)))


def pseudo_values(value: float, loo: np.ndarray) -> np.ndarray:
    """Jackknife pseudo-values G·θ − (G−1)·θ₍ᵢ₎: their mean's standard error is the jackknife SE."""
    G = len(loo)
    return G * value - (G - 1) * loo


def jackknife(
    metric: Metric,
    cell: CellData,
    value: float,
    groups: Sequence[Sequence[int]],
    *,
    n_boot: int = 1000,
    rng: np.random.Generator | None = None,
    keep: dict | None = None,
) -> tuple[float, float] | None:
    """Delete-one-prompt jackknife, studentised: θ − q · SE, q from a bootstrap-t of the pseudo-values.

    SE is the jackknife standard error; the t quantiles come from resampling the prompts'
    pseudo-values (which carries their skewness into the interval); None where a leave-one-out
    value is empty. A metric declared `unit_interval` (a share in (0, 1)) is jackknifed on the
    logit scale and the interval mapped back, so it stays inside (0, 1) and bends towards the
    middle, as a proportion's sampling distribution does near a bound."""
    loo = leave_one_out(metric, cell, groups)
    if keep is not None:
        keep[metric.name] = ("loo", loo)
    if np.isnan(loo).any():
        return None
    rng = rng or np.random.default_rng(0)
    if metric.unit_interval and 0 < value < 1 and bool(np.all((loo > 0) & (loo < 1))):
        logit = lambda x: np.log(x) - np.log1p(-x)
        interval = pseudo_interval(pseudo_values(logit(value), logit(loo)), float(logit(value)), n_boot=n_boot, rng=rng)
        return None if interval is None else tuple(float(1 / (1 + np.exp(-x))) for x in interval)  # type: ignore[return-value]
    return pseudo_interval(pseudo_values(value, loo), value, n_boot=n_boot, rng=rng)


def pseudo_interval(pseudo: np.ndarray, center: float, *, n_boot: int, rng: np.random.Generator):
    """Bootstrap-t interval of a jackknife estimate from its pseudo-values, centred on `center`, no side
    shorter than Student's t(G−1) interval of the pseudo-values' mean.

    With few prompts (16) the resampled pseudo-values' t distribution is too short-tailed on one side:
    distinct-2's interval missed the truth one-sidedly (91.4% coverage). The floor, t(G−1) as in the
    jackknife's own t-test, brought it to 94% at 16 prompts; with many prompts both quantiles exceed it
    and it changes nothing (docs/reports.md#confidence-intervals). Each replicate keeps its own SE: studentised
    by `spread_curve`, distinct-2's interval at 32 prompts narrowed (1.77x → 1.54x a normal one's width on
    bench_coverage's skewed process) but covered 92.7-93.2% where this covers 95%."""
    units = np.stack([pseudo, np.ones(len(pseudo))], axis=1)
    return studentized(units, values_of(ratio), n_boot=n_boot, rng=rng, is_ratio=True, center=center, t_floor=True)


def half_sample(
    metric: Metric,
    cell: CellData,
    value: float,
    groups: Sequence[Sequence[int]],
    *,
    n_reps: int,
    rng: np.random.Generator,
) -> tuple[float, float] | None:
    """Delete-half jackknife: `metric.fn` on `n_reps` halves of the prompts; estimate ± z · SE.

    Each replicate keeps m = G // 2 of the G prompts, drawn without replacement (so no
    generation is duplicated); SE = sd(replicates) · sqrt(m / (G - m)).
    """
    G = len(groups)
    m = G // 2
    draws = [rng.choice(G, size=m, replace=False) for _ in range(n_reps)]
    reps = np.array([_num(metric.fn(cell.subset([i for g in d for i in groups[g]]))) for d in draws])
    ok = reps[~np.isnan(reps)]
    if len(ok) < max(2, len(reps) / 2):
        return None
    half = Z * float(np.std(ok, ddof=1)) * math.sqrt(m / (G - m))
    return value - half, value + half


def confidence_intervals(
    metrics: list[tuple[str, Metric]],
    cell: CellData,
    values: dict[str, float],
    groups: list[list[int]],
    *,
    n_boot: int,
    n_boot_corpus: int,
    rng: np.random.Generator,
    reference_row: bool = False,
    keep: dict[str, tuple[str, np.ndarray]] | None = None,
    stats: dict[str, np.ndarray | None] | None = None,
) -> dict[str, tuple[float, float, str]]:
    """95% intervals over prompt resamples: {metric: (low, high, method)}; see the module doc.

    `n_boot`: the bootstrap's replicates; `n_boot_corpus`: the half-sample's (at most n_boot).
    A replicate always keeps all of a drawn prompt's generations (every seed) together.
    `keep`, if given, receives what paired comparisons need, per metric: ("sums", the (G, k)
    per-prompt statistics) of a bootstrap metric, ("loo", the G leave-one-out values) of a
    jackknife one, in the order of `groups`.
    """
    G = len(groups)
    if G < 2 or n_boot < 1:
        return {}
    out = {}
    for name, metric in metrics:
        value = values.get(name, math.nan)
        if math.isnan(value) or not applicable(metric, cell, reference_row=reference_row):
            continue
        if metric.interval == "bootstrap":
            known = (stats or {}).get(name)
            interval = bootstrap(metric, cell, groups, n_boot=n_boot, rng=rng, keep=keep, stats=known)
        elif metric.interval == "jackknife":
            interval = jackknife(metric, cell, value, groups, n_boot=n_boot, rng=rng, keep=keep)
        elif metric.interval == "half-sample":
            interval = half_sample(metric, cell, value, groups, n_reps=min(n_boot, n_boot_corpus), rng=rng)
        else:
            continue
        if interval is not None:
            out[name] = (*interval, metric.interval)
    return out


def prompt_groups(keys: list[str]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def cell_rng(seed: int, cell: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(cell.encode())])
