"""Interval constructions side by side on the same simulated cells: coverage, width, misses (issue 46).

    python benchmarks/bench_constructions.py --process skewed --prompts 32 --seeds 1 --sims 500
    python benchmarks/bench_constructions.py --process markov --prompts 16 32 --seeds 3 --metrics rep_2 distinct_2

Each simulation draws a cell as `bench_coverage.py` does (its skewed process or `process_markov.py`; simulation
s of G prompts from default_rng([G, s]), so both scripts see the same cells) and keeps each prompt's summed
statistics (additive metrics) or the leave-one-out values (jackknife metrics: distinct-2 and self-BLEU, their
pseudo-values on the scale the metric declares, `jackknife_scale`, as the report's: distinct-2's the logit,
self-BLEU's its own). From ONE set of 1,000 bootstrap replicates per cell (the
prompts resampled; each replicate's estimate θ* and delta-method SE se*), every construction:

- before:      the bootstrap-t, t* = (θ* − θ) / se*, no side inside Student's t(G − 1) (the report's until
               2026-12-06, and still its jackknife's);
- smoothed:    the same, each replicate studentised by the SE its estimate implies (`bootstrap_t.spread_curve`:
               Tibshirani 1988's variance function from the replicates): the report's for additive metrics;
- no-floor:    the bootstrap-t without the floor;
- student:     θ ± t(G − 1) · SE (for a ratio of sums, the delta-method / linearised t interval);
- symmetric:   θ ± q · SE, q the 95th percentile of |t*| (Hall 1988's symmetric bootstrap-t), at least t(G − 1);
- percentile, bca: the percentile and BCa intervals (Efron 1987: bias from the replicates, acceleration from
               the delete-one-prompt values, as scipy.stats.bootstrap's BCa computes them);
- expanded-bca: BCa at the level whose normal quantile is √(G/(G−1)) · t(G − 1) (Hesterberg 2015);
- stabilised:  the variance-stabilised bootstrap (Tibshirani 1988): g = ∫ 1 / s, s the same SE curve, the
               basic interval of g(θ*) − g(θ) mapped back, no side inside t(G − 1) · SE;
- hall:        Hall's (1992) skewness-removing transformation of the t statistic, γ the skewness of the
               prompts' linearised values;
- skew-corrected: Student's t(G − 1) interval with the side towards the skew widened by the one-term
               Edgeworth correction of the studentised mean, γ the adjusted skewness of the linearised values
               (`intervals.skew_corrected`: the report's for the jackknife metrics since 2026-12-06; no replicates).
- el, ael:     the empirical likelihood interval (`ratio_interval`: Owen 1988, 2001 ch. 3) of a ratio
               of two sums over prompts (rep-n, mean_length, eos_rate; the jackknife metrics' mean of pseudo-values:
               Jing, Yuan and Zhou 2009's jackknife EL), −2 log R(θ) ≤ F(1, G − 1)'s 95% quantile; `ael` the adjusted
               EL (Chen, Variyath and Abraham 2008: one pseudo-observation −max(1, log(G)/2) · z̄, defined beyond the
               convex hull). Measured, and not taken (docs/reports.md, "Empirical likelihood"): distinct-n took the
               adjusted EL on 2026-12-06 and gave it back the same day (it under-covered distinct-3).
- korn-graubard (a share: rep-n, eos_rate, distinct-n): Korn and Graubard's (1998) interval of a proportion from a
               clustered sample (prompts the clusters), Clopper–Pearson at the effective sample size
               p(1 − p) / SE² shrunk by (z / t(G − 1))², the SE the delta-method one of the prompts' sums (distinct-n's
               the jackknife's, on the linear scale). Measured, and not taken (docs/reports.md, "Korn and Graubard").
- efron-stein, efron-stein-skew (`--efron-stein`, jackknife metrics only): Student's and the skew-corrected
               interval with Efron and Stein's (1981) bias-corrected jackknife variance, from every pair's
               delete-two value (measured, not taken: docs/reports.md).

And `oracle`: θ − q · SE with q the exact 2.5% / 97.5% quantiles of (θ − truth) / SE over the simulations. No
report has them; it is the narrowest an interval studentised by this SE can be at 95% on average, and so a
bound on what the issue's width target can ask of such intervals. For a jackknife metric on the logit scale
`oracle` is on the linear scale (θ and truth linear, SE the logit one, as a scale) and `oracle-logit` on the
logit scale its intervals are built on (logit θ − q · SE, q the quantiles of (logit θ − logit truth) / SE,
mapped back).

Printed per metric: coverage, mean width / a normal interval's with the true spread (2 · 1.96 · the SD of the
estimates over the simulations), misses (truth above / below). The truth: the metric on 20,000 prompts (one
generation each) for the additive metrics, the estimates' mean for distinct-2 and self-BLEU (their value
depends on the cell's size). Cells whose SE is 0 (every generation alike, e.g. no EOS) are left out.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import optimize
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ beside it

from benchmarks import bench_coverage as bc
from controller.metrics import METRICS, ratio
from controller.report.stats.bootstrap_t import (
    MAX_K_PER_REPLICATE,
    from_replicates,
    gradient,
    linearised_se,
    prompt_sums,
    spread_curve,
    values_of,
)
from controller.report.stats.intervals import evaluate, jackknife_se, leave_one_out, pseudo_values, skew_corrected
from controller.report.stats.shares import share_interval, within_scale

B = 1000
EFRON_STEIN = False  # --efron-stein: the delete-two constructions of the jackknife metrics (O(G²) per cell)
SCALE = None  # --scale: the jackknife metrics' scale in place of the one each declares (to measure another)
LEVEL = 0.95
SKEWED = ["rep_2", "mean_length", "perplexity", "distinct_2", "self_bleu_4", "bleu", "eos_rate"]  # the default
ON_REFERENCES = {"bleu", "eos_rate"}  # on the skewed process, drawn on bench_coverage's reference cells
logit = lambda x: np.log(x) - np.log1p(-x)
expit = lambda x: 1 / (1 + np.exp(-x))


def bca(units: np.ndarray, f, estimates: np.ndarray, value: float, z: float) -> tuple[float, float]:
    """BCa limits at normal quantile ±z from the replicates' estimates and the delete-one-prompt values."""
    jack = f(units.sum(axis=0)[None] - units)
    e = estimates[np.isfinite(estimates)]
    z0 = sps.norm.ppf(np.clip((np.sum(e < value) + 0.5 * np.sum(e == value)) / len(e), 1e-4, 1 - 1e-4))
    d = jack.mean() - jack
    a = np.sum(d**3) / (6 * np.sum(d**2) ** 1.5) if np.sum(d**2) > 0 else 0.0
    q = [sps.norm.cdf(z0 + (z0 + x) / (1 - a * (z0 + x))) for x in (-z, z)]
    return tuple(float(np.percentile(e, 100 * p)) for p in q)  # type: ignore[return-value]


def stabilised(estimates, spreads, value, se, q_t) -> tuple[float, float]:
    """Tibshirani's variance-stabilised interval: g = ∫ 1/s on a grid, basic interval of g, mapped back."""
    ok = np.isfinite(estimates) & (spreads > 0)
    curve = spread_curve(estimates[ok], spreads[ok])
    lo, hi = min(estimates[ok].min(), value), max(estimates[ok].max(), value)
    grid = np.linspace(lo - (hi - lo), hi + (hi - lo), 2001)
    inv = 1 / curve(grid)
    g_grid = np.concatenate([[0], np.cumsum((inv[1:] + inv[:-1]) / 2 * np.diff(grid))])
    g = lambda x: np.interp(x, grid, g_grid)
    d = g(estimates[ok]) - g(value)
    q_low, q_high = np.percentile(d, [2.5, 97.5])
    floor = q_t * se / float(curve(value))
    q_low, q_high = min(q_low, -floor), max(q_high, floor)
    back = lambda u: float(np.interp(u, g_grid, grid))
    return back(g(value) - q_high), back(g(value) - q_low)


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
    a: np.ndarray, b: np.ndarray, *, adjusted: bool = True, level: float = LEVEL
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


def constructions(units: np.ndarray, f, is_ratio: bool, value: float, rng, center: float | None = None) -> dict:
    """Every construction's interval of f(Σ units) over resampled rows, from one set of replicates."""
    G, theta = len(units), value if center is None else center
    se = float(linearised_se(units, f, is_ratio=is_ratio))
    if not (math.isfinite(value) and math.isfinite(se)) or se == 0:
        return {}
    drawn = units[rng.integers(0, G, (B, G))]
    fixed = None if is_ratio or units.shape[1] <= MAX_K_PER_REPLICATE else units.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        est, spreads = f(drawn.sum(axis=-2)), linearised_se(drawn, f, is_ratio=is_ratio, at=fixed)
        t = (est - value) / spreads
    q_t, shift = float(sps.t.ppf((1 + LEVEL) / 2, G - 1)), theta - value
    q_sym = max(float(np.percentile(np.abs(t[np.isfinite(t)]), 95)), q_t)
    z = float(sps.norm.ppf((1 + LEVEL) / 2))
    z_expanded = math.sqrt(G / (G - 1)) * q_t
    d = units @ gradient(f, units.sum(axis=0), is_ratio=is_ratio)
    gamma = float(np.mean((d - d.mean()) ** 3) / np.mean((d - d.mean()) ** 2) ** 1.5)
    a, b = gamma / (3 * math.sqrt(G)), gamma / (6 * math.sqrt(G))
    hall_inv = lambda y: y - b if abs(a) < 1e-12 else (np.cbrt(1 + 3 * a * (y - b)) - 1) / a
    out = {
        "before": from_replicates(est, spreads, value, theta, se, G, t_floor=True),
        "smoothed": from_replicates(est, spreads, value, theta, se, G, t_floor=True, smooth=True),
        "no-floor": from_replicates(est, spreads, value, theta, se, G, t_floor=False),
        "student": (theta - q_t * se, theta + q_t * se),
        "symmetric": (theta - q_sym * se, theta + q_sym * se),
        "percentile": tuple(float(x) + shift for x in np.percentile(est[np.isfinite(est)], [2.5, 97.5])),
        "bca": tuple(x + shift for x in bca(units, f, est, value, z)),
        "expanded-bca": tuple(x + shift for x in bca(units, f, est, value, z_expanded)),
        "stabilised": tuple(x + shift for x in stabilised(est, spreads, value, se, q_t)),
        "hall": (theta - se * hall_inv(q_t), theta - se * hall_inv(-q_t)),
        "skew-corrected": skew_corrected(G * d, theta),  # G·d: linearised values on the scale of pseudo-values
        "_se": (se, se),
    }
    if units.shape[1] == 2:  # a ratio of two sums, or a monotone function of one (rep-n: 1 − unique / total)
        back = (lambda r: r) if is_ratio else (lambda r: float(f(np.array([r, 1.0]))))
        for name, adjusted in (("el", False), ("ael", True)):
            low, high = sorted(back(r) for r in ratio_interval(units[:, 0], units[:, 1], adjusted=adjusted))
            out[name] = (low + shift, high + shift)
    return out


def korn_graubard(p: float, se: float, G: int) -> tuple[float, float] | None:
    """Korn and Graubard's (1998) interval of a share from a clustered sample: Clopper–Pearson at the effective
    sample size n* = p(1 − p) / SE², shrunk by (z / t(G − 1))² for the G clusters' degrees of freedom; None where p
    is 0 or 1 or the SE 0 (the exact interval of nothing seen)."""
    if not (0 < p < 1 and se > 0):
        return None
    n = p * (1 - p) / se**2 * (sps.norm.ppf((1 + LEVEL) / 2) / sps.t.ppf((1 + LEVEL) / 2, G - 1)) ** 2
    x, a = p * n, (1 - LEVEL) / 2
    return float(sps.beta.ppf(a, x, n - x + 1)), float(sps.beta.ppf(1 - a, x + 1, n - x))


def scale_of(metric) -> str:
    """The scale a jackknife metric's constructions are built on: --scale, else the one it declares."""
    return SCALE or metric.jackknife_scale


def cell_intervals(metric_name: str, cell, groups, value: float, rng) -> dict:
    """The constructions of one metric on one cell: over its prompts' sums, or its pseudo-values (on its scale)."""
    metric = METRICS.get(metric_name)
    if metric.interval == "bootstrap":
        sums, of_ratio = prompt_sums(metric.stats(cell), groups), metric.combine is ratio
        out = constructions(sums, values_of(metric.combine), of_ratio, value, rng)
        if metric.unit_interval:  # a share: clipped to [0, 1], exact where binomial, as the report
            out = {k: v if k == "_se" else share_interval(v, sums, LEVEL, of_ratio=of_ratio) for k, v in out.items()}
            if out and (kg := korn_graubard(value, out["_se"][0], len(groups))):
                out["korn-graubard"] = share_interval(kg, sums, LEVEL, of_ratio=of_ratio)
        return out
    loo = leave_one_out(metric, cell, groups)
    logit_scale = scale_of(metric) == "logit"
    if np.isnan(loo).any() or (logit_scale and not (0 < value < 1 and np.all((loo > 0) & (loo < 1)))):
        return {}
    fwd, back = (logit, expit) if logit_scale else (np.asarray, np.asarray)
    pv = pseudo_values(float(fwd(value)), fwd(loo))
    units = np.stack([pv, np.ones(len(pv))], axis=1)
    out = constructions(units, values_of(ratio), True, float(pv.mean()), rng, center=float(fwd(value)))
    if EFRON_STEIN and out:
        out.update(efron_stein(metric, cell, groups, float(fwd(value)), fwd(loo), pv, fwd))
    out = {k: v if k.startswith("_") else (float(back(v[0])), float(back(v[1]))) for k, v in out.items()}
    if metric.unit_interval and not logit_scale:  # kept inside [0, 1] on its own scale, as the report's
        out = {k: v if k.startswith("_") else within_scale(v, len(groups), LEVEL) for k, v in out.items()}
    if metric.unit_interval and out and (kg := korn_graubard(value, jackknife_se(loo), len(groups))):
        out["korn-graubard"] = kg  # on the linear scale, from the linear jackknife SE
    return out


def efron_stein(metric, cell, groups, at: float, loo: np.ndarray, pv: np.ndarray, fwd) -> dict:
    """Student's and the skew-corrected interval with the Efron–Stein (1981) bias-corrected jackknife variance.

    V_J − Σ_{i<j} (Q_ij − Q̄)² / (G (G − 1)), Q_ij = G·θ − (G − 1)(θ₍ᵢ₎ + θ₍ⱼ₎) + (G − 2)·θ₍ᵢⱼ₎ from the
    delete-two values (every pair of prompts; on the metric's jackknife scale, `fwd`): unbiased where the
    statistic is a sum of pairwise terms, whose variance the delete-one jackknife counts twice. Floored at a
    quarter of V_J. The skew-corrected one rescales the pseudo-values about their mean to that variance
    (skewness kept)."""
    G = len(groups)
    two = np.full((G, G), np.nan)  # θ₍ᵢⱼ₎: the leave-one-out values of the cell without prompt i (groups partition it)
    for i in range(G):
        keep = [x for j, items in enumerate(groups) if j != i for x in items]
        at_ = {x: k for k, x in enumerate(keep)}
        others = [j for j in range(G) if j != i]
        two[i, others] = leave_one_out(metric, cell.subset(keep), [[at_[x] for x in groups[j]] for j in others])
    pairs = np.triu_indices(G, 1)
    two = fwd(two[pairs])
    if not np.all(np.isfinite(two)):
        return {}
    q = G * at - (G - 1) * (loo[pairs[0]] + loo[pairs[1]]) + (G - 2) * two
    v_j = (G - 1) / G * float(np.sum((loo - loo.mean()) ** 2))
    raw = v_j - float(np.sum((q - q.mean()) ** 2)) / (G * (G - 1))
    v = max(raw, 0.25 * v_j)
    se, q_t = math.sqrt(v), float(sps.t.ppf((1 + LEVEL) / 2, G - 1))
    scaled = pv.mean() + (pv - pv.mean()) * math.sqrt(v / v_j) if v_j > 0 else pv
    skew = skew_corrected(scaled, at)
    out = {"efron-stein": (at - q_t * se, at + q_t * se), "_variances": (v_j, raw)}  # the caller maps them back
    if skew is not None:
        out["efron-stein-skew"] = skew
    return out


def run(process: str, G: int, sims: int, names: list[str], start: int = 0) -> dict[str, list]:
    found: dict[str, list] = {}  # metric -> [(value, {construction: (low, high)})]
    for s in range(start, start + sims):
        rng = np.random.default_rng([G, s])
        if process == "markov":
            cell, groups = bc.markov_cell(G, rng)
            cells = {m: cell for m in names}
        else:
            cell, groups = bc.simulate_cell(G, rng)
            ref = bc.reference_cell(G, np.random.default_rng([G, s, 5]))
            cells = {m: ref if m in ON_REFERENCES else cell for m in names}
        for m in names:
            value = evaluate([(m, METRICS.get(m))], cells[m])[m]
            out = cell_intervals(m, cells[m], groups, value, np.random.default_rng([s, 7]))
            if out:
                found.setdefault(m, []).append((value, out))
    return found


def report(found: dict[str, list], truth: dict[str, float]) -> None:
    for m, rows in found.items():
        values = np.array([v for v, _ in rows])
        target = truth.get(m, float(values.mean()))
        normal = 2 * 1.959964 * values.std(ddof=1)
        se = np.array([c["_se"][0] for _, c in rows])
        q_low, q_high = np.percentile((values - target) / se, [2.5, 97.5])
        print(f"  {m:12s} {'oracle':13s}  95.0%  x{np.mean((q_high - q_low) * se) / normal:.2f}")
        scale = scale_of(METRICS.get(m)) if METRICS.get(m).interval == "jackknife" else None
        at = values if scale != "logit" else logit(values)  # a jackknife metric's value on its interval's scale
        if scale == "logit":  # the oracle on that scale too
            q_low, q_high = np.percentile((at - logit(target)) / se, [2.5, 97.5])
            width = np.mean(expit(at - q_low * se) - expit(at - q_high * se)) / normal
            print(f"  {m:12s} {'oracle-logit':13s}  95.0%  x{width:.2f}")
        if "_variances" in rows[0][1]:  # --efron-stein: each variance estimate against the true one, on that scale
            v = np.array([c["_variances"] for _, c in rows])
            true, floored = float(np.var(at, ddof=1)), float(np.mean(v[:, 1] < 0.25 * v[:, 0]))
            print(
                f"  {m:12s} variance ({scale}): jackknife x{v[:, 0].mean() / true:.2f}, Efron-Stein"
                f" x{v[:, 1].mean() / true:.2f} (unfloored; under a quarter of the jackknife's in {floored:.0%})"
            )
        for name in rows[0][1]:
            if name.startswith("_"):
                continue
            iv = np.array([c.get(name, (math.nan, math.nan)) for _, c in rows], dtype=float)
            above, below, n = int(np.sum(target > iv[:, 1])), int(np.sum(target < iv[:, 0])), len(iv)
            width = np.nanmean(iv[:, 1] - iv[:, 0]) / normal
            print(f"  {m:12s} {name:13s} {(n - above - below) / n:6.1%}  x{width:.2f}  ({above}/{below} of {n})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--process", choices=["skewed", "markov"], default="skewed")
    ap.add_argument("--prompts", type=int, nargs="+", default=[32])
    ap.add_argument("--seeds", type=int, default=1, help="generations per prompt")
    ap.add_argument("--sims", type=int, default=500)
    ap.add_argument("--metrics", nargs="+", default=None)
    ap.add_argument("--population", type=int, default=20_000)
    ap.add_argument(
        "--start", type=int, default=0, help="index of the first simulation (fresh cells: past the last run)"
    )
    ap.add_argument("--efron-stein", action="store_true", help="also the delete-two (Efron–Stein) constructions")
    ap.add_argument("--scale", choices=["logit", "linear"], help="the jackknife metrics' scale, not their own")
    args = ap.parse_args()
    global EFRON_STEIN, SCALE
    EFRON_STEIN, SCALE = args.efron_stein, args.scale
    names = args.metrics or (bc.MARKOV_NAMES if args.process == "markov" else SKEWED)
    bc.SEEDS = 1  # the population: one generation per prompt
    truth = bc.population(args.population, seed=10**6, process=args.process)
    bc.SEEDS = args.seeds
    for G in args.prompts:
        last = args.start + args.sims - 1
        print(f"{args.process} process, {G} prompts x {args.seeds} seed(s), simulations {args.start}-{last}")
        report(run(args.process, G, args.sims, names, args.start), truth)


if __name__ == "__main__":
    main()
