"""Paired comparisons: each cell against a baseline cell, metric by metric, over common prompts.

Generation seeds hash only (job seed, prompt id), so every strategy and model of a sweep draws
the same random numbers for the same prompt and seed: cells are paired samples (common random
numbers). A comparison therefore resamples *prompts* and takes both cells' generations of a drawn
prompt (every seed) together, so prompt-to-prompt variation that both cells share cancels.

Per metric, for each cell against its baseline (default: the first cell of the same model in
plan order; `baseline` names a strategy, taken per model, or one cell key for every cell):

- `<m>_diff`: value(cell) − value(baseline), on all generations of each; a plain corpus metric's (distinct-n,
  self-BLEU, Zipf: its value moves with a cell's generations) of each prompt's first generation in both where
  the cells' generations a prompt differ (`cellstats.matched`; named in `first_generation_diffs`);
- `<m>_diff_ci_low`, `<m>_diff_ci_high`: a paired 95% interval over the common prompts: the
  studentised bootstrap (scipy.stats.bootstrap over prompt indices) of an additive metric's
  difference, the bootstrap-t of the difference's jackknife pseudo-values of a plain one; neither
  with a side shorter than Student's t(G − 1); inside the values a difference of the metric's can take
  (`bootstrap_t.difference_bounds` of `Metric.bounds`: a share's in [−1, 1]);
- `<m>_diff_p`: two-sided p-value of "no difference": a paired permutation test (scipy's
  `permutation_test`, the two cells' generations of a prompt swapped, the metric recomputed on each
  arrangement: `swaps`; per generation where the cells' generations a prompt differ, but a per-prompt metric's
  prompts as they are, `Metric.per_prompt`: pass@k, maj@k) for an additive metric,
  a union metric (distinct-n, from each prompt's distinct n-grams), self-BLEU (from each generation's n-gram
  occurrences, where a prompt has as many generations in both cells) and Zipf (from each prompt's word counts),
  the jackknife t-test for another plain one (a plugin's without swap items) and for one whose cell held more
  items than were kept (`intervals.MAX_KEPT_ITEMS`); for a share
  of which every
  common prompt holds one 0/1 outcome in both cells (exact_match of two cells with one generation per
  prompt), McNemar's mid-p test; for a share of 0/1 outcomes with several generations per prompt
  (eos_rate over seeds or samples, pass@1 of samples), the permutation test's mid-p value, which does not lose size to
  the ties of counts. Where fewer than TAIL_COUNT of the random permutations are as extreme as the
  observed statistic, a permutation p is estimated by importance sampling of the swaps (`tail_p`, unless the
  plain count makes it implausible): a Monte Carlo p is never below 2 / (n + 1), which Holm multiplies;
- `<m>_diff_p_holm`: the p-value adjusted by Holm's step-down method over every p-value of the
  table (all cells and metrics), which controls the family-wise error rate at the level read.

Pure: works on the per-cell statistics the intervals kept (`intervals.confidence_intervals(keep=, keep_items=)`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as sps
from scipy.optimize import brentq

from controller.metrics import Metric, ratio
from controller.report.stats import swaps
from controller.report.stats.bootstrap_t import (
    MAX_K_PER_REPLICATE,
    bounded,
    difference_bounds,
    gradient,
    studentized,
    values_of,
)
from controller.report.stats.cellstats import CellStats, align, generations, matched
from controller.report.stats.intervals import jackknife_se

SUFFIXES = ("_diff", "_diff_ci_low", "_diff_ci_high", "_diff_p", "_diff_p_holm")
BASELINE_COLUMN = "baseline"
FIRSTS_COLUMN = "first_generation_diffs"  # the metrics compared on each prompt's first generation (`matched`)
TAIL_COUNT = 10  # fewer permutations as extreme as the observed than this: the tail's p from `tail_p`
TAIL_TRUST = 0.001  # `tail_p` is set aside where the plain draws' count makes it this unlikely (`_least_tail`)


def on_first_generations(row: Mapping[str, Any]) -> set[str]:
    """The metrics a summary row's comparison took on each prompt's first generation (its `FIRSTS_COLUMN`)."""
    value = row.get(FIRSTS_COLUMN)
    return set(value.split()) if isinstance(value, str) else set()


def comparison_columns(metric_names: Sequence[str]) -> list[str]:
    return [BASELINE_COLUMN, FIRSTS_COLUMN] + [f"{m}{s}" for m in metric_names for s in SUFFIXES]


def is_comparison_column(column: str) -> bool:
    return column == BASELINE_COLUMN or "_diff" in column


def baselines(cells: Sequence[CellStats], baseline: str | None) -> dict[str, str | None]:
    """cell -> its baseline cell (None for a baseline itself or when none matches)."""
    keys = [c.cell for c in cells]
    out: dict[str, str | None] = {}
    for c in cells:
        if baseline in keys:
            base = baseline
        else:
            same = [d for d in cells if d.model == c.model and (baseline is None or d.strategy == baseline)]
            base = same[0].cell if same else None
        out[c.cell] = None if base == c.cell else base
    return out


def _rows(idx: np.ndarray, axis: int) -> np.ndarray:
    return np.moveaxis(np.asarray(idx, dtype=np.intp), axis, -1)


def paired_interval(sums_a: np.ndarray, sums_b: np.ndarray, combine: Callable, *, n_boot: int, rng) -> tuple | None:
    """Studentised bootstrap interval of metric(a) − metric(b), resampling common prompts (both rows together),
    no side shorter than Student's t(G−1).

    Each replicate is studentised by the delta-method SE at its own sums (the gradient is the metric's
    on each side, a's minus b's) wherever one cell's is (a ratio, or few statistics), as a bootstrap-t
    should be. The floor comes from `benchmarks/bench_paired.py` under the null (B drawn as A, common
    random numbers): without it, and with every replicate studentised at the sample's sums, rep_2's
    interval covered 0 in 89.7% / 91.7% / 93.3% of 1,000 simulations at 16 / 32 / 128 prompts (a
    repetition difference is heavy-tailed: mostly ~0, a few looping prompts); now 95.7 / 95.5 / 95.4%
    (docs/reports.md#paired-comparisons)."""
    k = sums_a.shape[1]
    f = values_of(combine)
    is_ratio = combine is ratio
    grad = None
    if is_ratio or k <= MAX_K_PER_REPLICATE:

        def grad(s: np.ndarray) -> np.ndarray:
            return np.concatenate(
                [gradient(f, s[..., :k], is_ratio=is_ratio), -gradient(f, s[..., k:], is_ratio=is_ratio)], axis=-1
            )

    units = np.hstack([sums_a, sums_b])
    diff = lambda s: f(s[..., :k]) - f(s[..., k:])
    return studentized(units, diff, n_boot=n_boot, rng=rng, t_floor=True, grad=grad)


def permutation_p(statistic: swaps.Statistic, G: int, *, n_resamples: int, rng, mid: bool = False) -> float:
    """Two-sided paired permutation p-value of `statistic` (`controller.report.stats.swaps`: metric(a) − metric(b)
    with the swapped prompts' generations exchanged), each prompt swapped at random; exact (every arrangement)
    where 2^G is at most `n_resamples`. `mid`: the mid-p value (`mid_p`), for a statistic with few distinct
    values (counts of 0/1 outcomes). Far in the tail, `tail_p`."""

    def on_indices(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return statistic(_rows(x, axis) >= G)  # x holds prompt i's row i (kept) or i + G (swapped)

    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore")
        res = sps.permutation_test(
            (np.arange(G), np.arange(G) + G),
            on_indices,
            permutation_type="samples",
            vectorized=True,
            n_resamples=n_resamples,
            alternative="two-sided",
            rng=rng,
        )
    exact = len(res.null_distribution) == 2**G
    if mid and math.isfinite(res.statistic):
        p = mid_p(np.asarray(res.null_distribution), float(res.statistic), exact=exact)
    else:
        p = float(res.pvalue) if math.isfinite(res.pvalue) else math.nan
    if not exact and p * (n_resamples + 1) / 2 < TAIL_COUNT:
        tail = tail_p(statistic, G, n_draws=n_resamples, rng=rng, mid=mid)
        p = tail if math.isfinite(tail) and tail >= _least_tail(res.null_distribution, res.statistic) else p
    return p


def _least_tail(null: np.ndarray, observed: float) -> float:
    """The least two-sided p the plain draws' count allows (Clopper-Pearson at TAIL_TRUST): a tail below it aimed off
    the mass of a statistic far from linear in the swaps (self-BLEU, beam v greedy: 3.8e-6 for 0.013)."""
    null = np.asarray(null, dtype=float)
    hits = int(np.count_nonzero(np.abs(null) >= abs(observed) * (1 - 1e-12)))
    return float(sps.beta.ppf(TAIL_TRUST, hits, len(null) - hits + 1)) if hits else 0.0


def _each_swapped_alone(statistic: swaps.Statistic, G: int, rows: int = 1024) -> np.ndarray:
    """The statistic with prompt i alone swapped, for each i (the identity's rows, `rows` at a time)."""
    out = np.empty(G)
    for i in range(0, G, rows):
        k = min(rows, G - i)
        masks = np.zeros((k, G), dtype=bool)
        masks[np.arange(k), i + np.arange(k)] = True
        out[i : i + k] = statistic(masks)
    return out


def tail_p(statistic: swaps.Statistic, G: int, *, n_draws: int, rng, mid: bool = False) -> float:
    """Two-sided permutation p of `statistic` far in its tail, by importance sampling (Davison and Hinkley 1997,
    §9.4; Mehta, Patel and Senchaudhuri 1988): NaN where it cannot tell (fewer than TAIL_COUNT draws reach the
    observed value).

    A swap arrangement s (s_i = +1 keeps prompt i, −1 swaps its two cells' generations) is drawn with prompt i kept
    with probability π_i = (1 + tanh(t·e_i)) / 2 instead of ½: e_i is prompt i's share of the statistic on the
    line through the observed arrangement, half of what swapping prompt i alone takes from the observed value
    (oriented so that the observed value is positive), and t the exponential tilt that centres Σ s_i·e_i at its
    observed value (the saddlepoint). Each draw is weighted by its likelihood ratio Π ½ / π_i(s_i) =
    exp(K(t) − t·Σ s_i·e_i), K(t) = Σ log cosh(t·e_i), so that the mean of weight × [the statistic, recomputed on
    the draw, reaches the observed one] is the exact permutation tail, whatever the tilt; the tilt only makes the
    draws land there. The p is twice that tail (metric(a) − metric(b) is odd in the swaps: swapping every prompt
    negates it, so both tails are equal) plus two of its standard errors: an upper bound of the estimate, not a
    smaller p than the draws support. `mid`: ties with the observed value count by half (the mid-p, `mid_p`)."""
    observed = float(statistic(np.zeros(G, dtype=bool)))
    sign = math.copysign(1.0, observed)  # the tail the observed value is in, taken as the upper one
    e = (observed - _each_swapped_alone(statistic, G)) / 2 * sign
    if observed == 0 or not (math.isfinite(observed) and np.all(np.isfinite(e))) or e.sum() <= 0:
        return math.nan
    top = float(np.abs(e).sum())
    target = min(float(e.sum()), 0.999 * top)  # every prompt moved the same way: the tilt as far as it goes

    def slope(t: float) -> float:
        return float(np.sum(e * np.tanh(t * e)))

    hi = 1.0 / float(np.abs(e).max())
    while slope(hi) < target:
        hi *= 2
    t = brentq(lambda x: slope(x) - target, 0.0, hi, xtol=1e-12 * hi)
    keep = rng.random((n_draws, G)) < (1 + np.tanh(t * e)) / 2
    log_cosh = np.abs(t * e) + np.log1p(np.exp(-2 * np.abs(t * e))) - math.log(2)
    weight = np.exp(log_cosh.sum() - t * (np.where(keep, 1.0, -1.0) @ e))
    gap = (statistic(~keep) - observed) * sign
    gamma = 1e-12 * max(1.0, abs(observed))
    hit = (gap > gamma) + (0.5 if mid else 1.0) * (np.abs(gap) <= gamma)
    if np.count_nonzero(hit) < TAIL_COUNT:
        return math.nan
    tail = weight * hit
    least = least_p(G, mid=mid)
    return float(min(1.0, max(least, 2 * (tail.mean() + 2 * tail.std(ddof=1) / math.sqrt(n_draws)))))


def least_p(G: int, *, mid: bool = False) -> float:
    """The least two-sided p a test that swaps G prompts can give: the observed arrangement and its mirror, of 2^G
    (a mid-p counts them by half). McNemar's mid-p over G prompts is no smaller (its least, 2^-k of k ≤ G)."""
    return 2.0**-G if mid else 2.0 ** (1 - G)


def mid_p(null: np.ndarray, observed: float, *, exact: bool) -> float:
    """Two-sided mid-p of a permutation distribution (Lancaster 1961): twice the smaller one-sided tail,
    each counting the values equal to the observed one by half. The plain p counts them whole, which
    with the many ties of 0/1 counts makes the test reject a true null less often than it should
    (docs/reports.md). A random (not exact) null counts the observed arrangement as one more draw."""
    null = null[np.isfinite(null)]
    gamma = 1e-12 * max(1.0, abs(observed))
    above, equal = float(np.sum(null > observed + gamma)), float(np.sum(np.abs(null - observed) <= gamma))
    below, n = len(null) - above - equal, len(null)
    if not exact:
        equal, n = equal + 1, n + 1
    return float(min(1.0, 2 * (min(above, below) + 0.5 * equal) / n)) if n else math.nan


def counted_outcomes(
    metric: Metric, sums_a: np.ndarray, sums_b: np.ndarray, counts: tuple[np.ndarray, np.ndarray] | None = None
) -> bool:
    """A share of 0/1 outcomes (eos_rate, exact_match) with several generations per prompt: each prompt's
    sums are whole counts (right, generations), so the paired statistic takes few distinct values. A per-prompt
    metric's (`Metric.per_prompt`: pass@1, maj@k) are such counts over the prompt's generations (`counts`, in
    each cell), (c / n, 1)."""
    if not metric.unit_interval or metric.combine is not ratio or sums_a.shape[1] != 2:
        return False
    if metric.per_prompt:
        if counts is None:
            return False
        sums_a, sums_b = (s * np.asarray(k, dtype=float)[:, None] for s, k in zip((sums_a, sums_b), counts))
    both = np.concatenate([sums_a, sums_b])
    return bool(np.allclose(both, np.round(both), rtol=0, atol=1e-9))


def one_outcome(metric: Metric, sums_a: np.ndarray, sums_b: np.ndarray) -> bool:
    """A share (e.g. exact_match) of which each common prompt holds one 0-or-1 outcome in both cells."""
    if not metric.unit_interval or metric.combine is not ratio or sums_a.shape[1] != 2:
        return False
    both = np.concatenate([sums_a, sums_b])  # a per-prompt value's n rows of (v/n, 1/n) sum to (v, 1) up to rounding
    one = np.isclose(both, 1.0, rtol=0, atol=1e-9)
    return bool(np.all(one[:, 1]) and np.all(one[:, 0] | np.isclose(both[:, 0], 0.0, rtol=0, atol=1e-9)))


def mcnemar_p(sums_a: np.ndarray, sums_b: np.ndarray) -> float:
    """McNemar's mid-p test of paired 0/1 outcomes (Fagerland, Lydersen and Laake 2013): of the n prompts right
    in one cell only, b right in a is Binomial(n, 1/2) under the null; with k the smaller of b and n − b, the
    mid-p is 2 · P(X < k) + P(X = k): the exact p, 2 · P(X ≤ k), less the probability of k, and 1 where b = n / 2
    (no difference; the exact p is capped at 1 there, so the mid-p cannot be had from it). The exact p rejects a
    true null far less often than its level with few discordant prompts (1.0% at 16 prompts, docs/reports.md);
    1 where no prompt is discordant."""
    a, b = sums_a[:, 0] > 0.5, sums_b[:, 0] > 0.5
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    if only_a + only_b == 0:
        return 1.0
    n, k = only_a + only_b, min(only_a, only_b)
    return float(min(1.0, 2 * sps.binom.cdf(k - 1, n, 0.5) + sps.binom.pmf(k, n, 0.5)))


def pseudo_interval(pseudo: np.ndarray, center: float, *, n_boot: int, rng: np.random.Generator):
    """Bootstrap-t interval of a jackknife estimate from its pseudo-values, centred on `center`, no side
    shorter than Student's t(G−1) interval of the pseudo-values' mean: a paired difference's (a cell's own
    is `intervals.skew_corrected`).

    With few prompts (16) the resampled pseudo-values' t distribution is too short-tailed on one side:
    distinct-2's interval missed the truth one-sidedly (91.4% coverage). The floor, t(G−1) as in the
    jackknife's own t-test, brought it to 94% at 16 prompts; with many prompts both quantiles exceed it
    and it changes nothing (docs/reports.md#confidence-intervals). Each replicate keeps its own SE: studentised
    by `spread_curve`, distinct-2's interval at 32 prompts narrowed (1.77x → 1.54x a normal one's width on
    bench_coverage's skewed process) but covered 92.7-93.2% where this covers 95%."""
    units = np.stack([pseudo, np.ones(len(pseudo))], axis=1)
    return studentized(units, values_of(ratio), n_boot=n_boot, rng=rng, is_ratio=True, center=center, t_floor=True)


def jackknife_t(loo_a: np.ndarray, loo_b: np.ndarray, diff: float, *, n_boot: int, rng) -> tuple[float, float, float]:
    """Paired delete-one-prompt jackknife of a difference: (low, high, two-sided p).

    The interval is the bootstrap-t of the difference's pseudo-values (as for one cell); the
    p-value the jackknife t-test, t = diff / SE with G − 1 degrees of freedom."""
    G = len(loo_a)
    se = jackknife_se(loo_a - loo_b)
    pseudo = G * diff - (G - 1) * (loo_a - loo_b)
    interval = pseudo_interval(pseudo, diff, n_boot=n_boot, rng=rng) or (math.nan, math.nan)
    if se == 0:
        p = 1.0 if diff == 0 else 0.0
    else:
        p = float(2 * sps.t.sf(abs(diff) / se, G - 1))
    return *interval, p


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of p-values (NaN stays NaN and does not count)."""
    p = np.asarray(pvalues, dtype=float)
    ok = np.flatnonzero(np.isfinite(p))
    out = np.full(len(p), np.nan)
    m = len(ok)
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def compare_pair(
    a: CellStats, b: CellStats, metrics: Mapping[str, Metric], *, n_boot: int, rng: np.random.Generator
) -> dict[str, Any]:
    """`<m>_diff`, its paired interval and p-value for every metric both cells have (NaN elsewhere); a plain corpus
    metric's of each prompt's first generation in both where their generations a prompt differ (`FIRSTS_COLUMN`)."""
    out: dict[str, Any] = {}
    firsts = matched(a, b)
    on_firsts = [name for name in metrics if firsts is not None and a.plain(name) and b.plain(name)]
    for name, metric in metrics.items():
        x, y = firsts if name in on_firsts else (a, b)  # type: ignore[misc]
        diff = math.nan if x is None or y is None else x.values.get(name, math.nan) - y.values.get(name, math.nan)
        aligned = align(x, y, name) if math.isfinite(diff) else None
        lo = hi = p = math.nan
        if aligned is not None:
            kind, sa, sb, ia, ib = aligned
            if kind == "sums":
                interval = paired_interval(sa, sb, metric.combine, n_boot=n_boot, rng=rng)
                lo, hi = interval if interval is not None else (math.nan, math.nan)
                p = mcnemar_p(sa, sb) if one_outcome(metric, sa, sb) else None
                if p is None:
                    counts = generations(x, y, ia, ib)
                    mid = counted_outcomes(metric, sa, sb, counts)
                    # a per-prompt metric's prompts weigh one each already: exchanged as they are
                    statistic = swaps.additive(sa, sb, metric.combine, None if metric.per_prompt else counts)
                    p = permutation_p(statistic, len(sa), n_resamples=n_boot, rng=rng, mid=mid)
            elif not (np.isnan(sa).any() or np.isnan(sb).any()):
                lo, hi, t_p = jackknife_t(sa, sb, diff, n_boot=n_boot, rng=rng)
                statistic = None  # the jackknife t-test: no swap items, too many to keep, or allowing no swaps
                if name in x.items and name in y.items:  # distinct-n, self-BLEU: recomputed on swapped prompts
                    statistic = swaps.of_items(x.items[name].take(ia), y.items[name].take(ib))
                p = t_p if statistic is None else permutation_p(statistic, len(ia), n_resamples=n_boot, rng=rng)
        lo, hi = bounded((lo, hi), difference_bounds(metric.bounds))
        out |= dict(zip((f"{name}{s}" for s in SUFFIXES[:4]), (diff, lo, hi, p)))
    return out | {FIRSTS_COLUMN: " ".join(on_firsts) or None}


def with_holm(
    base_of: Mapping[str, str | None], pairs: Mapping[str, Mapping[str, Any]], metrics: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """cell -> its comparison columns (`baseline` and the `<m>_diff*` of every metric), Holm over the table.

    `base_of`: each cell's baseline (`baselines`; None for a baseline itself), in the table's order;
    `pairs`: each compared cell's `compare_pair` columns (a cached one's NaN read back as None)."""
    out: dict[str, dict[str, Any]] = {}
    for cell, base in base_of.items():
        if base is None:
            out[cell] = {BASELINE_COLUMN: None}
            continue
        out[cell] = {BASELINE_COLUMN: base, **{k: math.nan if v is None else v for k, v in pairs[cell].items()}}
    slots = [(cell, f"{m}_diff_p") for cell in out for m in metrics if f"{m}_diff_p" in out[cell]]
    for (cell, col), adjusted in zip(slots, holm([out[cell][col] for cell, col in slots])):
        out[cell][f"{col}_holm"] = adjusted
    return out


def compare_cells(
    cells: Sequence[CellStats],
    metrics: Mapping[str, Metric],
    *,
    baseline: str | None,
    n_boot: int,
    rng_for: Callable[[str], np.random.Generator],
) -> dict[str, dict[str, Any]]:
    """Every cell compared with its baseline, here, all statistics held (the report runs each pair as a
    task of its own: controller.report.compute.pairs)."""
    base_of = baselines(cells, baseline)
    by_key = {c.cell: c for c in cells}
    pairs = {
        c.cell: compare_pair(c, by_key[base], metrics, n_boot=n_boot, rng=rng_for(c.cell))
        for c in cells
        if (base := base_of[c.cell]) is not None
    }
    return with_holm(base_of, pairs, list(metrics))
