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
  Student's t(G − 1) interval of the pseudo-values widened on the side of their skew by the
  Edgeworth correction of the studentised mean (`skew_corrected`), never inside Student's;
- "half-sample": the delete-half jackknife, `fn` on halves of the prompts.

Each interval is kept inside the values its metric can take (`Metric.bounds`, `bootstrap_t.bounded`).

Nothing here knows any metric. docs/reports.md explains the methods and their measured coverage.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

from controller.metrics import CellData, CountItems, Metric, OverlapItems, UnionItems, column_sums, ratio
from controller.report.stats.bootstrap_t import (
    CI_LEVEL,
    Z,
    as_float,
    bounded,
    prompt_sums,
    studentized,
    values_of,
)
from controller.report.stats.shares import outcome_counts, share_interval, within_scale

# a union metric's items (or a plain one's swap_items) kept for its paired swap test, at most (2 MiB of hashes;
# distinct-3 of 128 prompts x 3 seeds x 100 words holds ~38,000, self-BLEU's n-gram occurrences ~150,000): a larger
# cell's comparison takes the jackknife t-test (docs/reports.md)
MAX_KEPT_ITEMS = 1 << 18


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
            out[name] = math.nan if st is None else as_float(m.combine(column_sums(st)))
        else:
            out[name] = as_float(m.fn(cell))
    return out


# -- the bootstrap of additive metrics ------------------------------------------------------


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
    if metric.unit_interval:  # a share: inside [0, 1]; exact where each prompt is a 0/1 outcome, or all are alike
        counts = per_prompt
        if metric.outcomes and metric.per_prompt:  # pass@1: its prompts' shares as counts of their answers
            counts = outcome_counts(per_prompt, [len(g) for g in groups])  # None: unequal samples a prompt
        clustered = metric.outcomes and counts is not None
        return share_interval(interval, per_prompt if counts is None else counts, CI_LEVEL, of_ratio=is_ratio,
                              outcomes=clustered)  # fmt: skip
    return interval


# -- jackknives of the plain corpus metrics -------------------------------------------------


def leave_one_out(metric: Metric, cell: CellData, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """The metric without each prompt in turn: its exact `leave_one_out`, else `fn` on each subset."""
    if metric.leave_one_out is not None:
        return np.asarray(metric.leave_one_out(cell, groups), dtype=float)
    return recomputed(metric, cell, groups)


def recomputed(
    metric: Metric, cell: CellData, groups: Sequence[Sequence[int]], which: Sequence[int] | None = None
) -> np.ndarray:
    """`fn` on the cell without each group in turn (of `which`, default every group): G evaluations of a cell."""
    out = []
    for g in range(len(groups)) if which is None else which:
        keep = [i for h, items in enumerate(groups) if h != g for i in items]
        out.append(as_float(metric.fn(cell.subset(keep))))
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
    keep: dict | None = None,
    keep_items: dict | None = None,
) -> tuple[float, float] | None:
    """Delete-one-prompt jackknife: Student's interval of the pseudo-values, skew-corrected (`skew_corrected`).

    SE is the jackknife standard error; None where a leave-one-out value is empty. A metric whose
    `jackknife_scale` is "logit" (a share of counted things in (0, 1), distinct-n) is jackknifed on the
    logit scale and the interval mapped back, so it bends towards the middle, as a proportion's
    sampling distribution does near a bound; the others on their own scale (self-BLEU, a mean of bounded
    scores: at 16 and 32 prompts 1.08-1.33x the width of a normal interval with the true spread, on the
    logit scale 1.08-1.54x, covering 93.3-97.0% there, 94.4-98.0%: docs/reports.md). A `unit_interval`
    metric's interval stays inside [0, 1]. A union metric's items (distinct-n's hashed n-grams, at most
    MAX_KEPT_ITEMS) go to `keep_items`, for its paired swap test, and so do a plain metric's `swap_items` (self-BLEU's
    n-gram occurrences, Zipf's word counts, as many at most)."""
    if metric.union_items is not None:
        items = metric.union_items(cell, groups)
        loo = items.leave_one_out()
        if keep_items is not None and len(items.items) <= MAX_KEPT_ITEMS:
            keep_items[metric.name] = items
    else:
        loo = leave_one_out(metric, cell, groups)
        if keep_items is not None and metric.swap_items is not None:  # self-BLEU's occurrences, Zipf's counts
            swap = metric.swap_items(cell, groups, MAX_KEPT_ITEMS)
            if swap is not None:
                keep_items[metric.name] = swap
    if keep is not None:
        keep[metric.name] = ("loo", loo)
    if np.isnan(loo).any():
        return None
    if metric.jackknife_scale == "logit" and 0 < value < 1 and bool(np.all((loo > 0) & (loo < 1))):
        logit = lambda x: np.log(x) - np.log1p(-x)
        interval = skew_corrected(pseudo_values(logit(value), logit(loo)), float(logit(value)))
        if interval is not None:
            interval = tuple(float(1 / (1 + np.exp(-x))) for x in interval)  # type: ignore[assignment]
    else:
        interval = skew_corrected(pseudo_values(value, loo), value)
    if interval is None or not metric.unit_interval:
        return interval
    return within_scale(interval, len(groups), CI_LEVEL)


def skew_corrected(pseudo: np.ndarray, center: float) -> tuple[float, float] | None:
    """Student's t(G − 1) interval of the pseudo-values' mean, centred on `center`, its side towards
    the pseudo-values' skew widened by the one-term Edgeworth correction of the studentised mean.

    The studentised mean T of G values of skewness γ has P(T ≤ x) ≈ Φ(x) + γ (2x² + 1) φ(x) / (6√G)
    (Hall 1992, "The Bootstrap and Edgeworth Expansion", ch. 2), so its quantiles move by
    −γ (2x² + 1) / (6√G): with γ < 0 (a few prompts far below the rest, as looping ones make distinct-n)
    the lower end reaches further down. Here x = t(G − 1) and γ the adjusted sample skewness G₁ of the
    pseudo-values; neither side comes inside Student's (the side away from the skew stays Student's).
    It replaced the bootstrap-t of the pseudo-values, whose replicates that draw none of a cell's few
    outlying prompts have a tiny SE and a t far out: that made distinct-2's interval at 32 prompts 1.76×
    the width of a normal interval with the true spread and self-BLEU's 2.42× (skewed process, 1 seed, on
    the logit scale), this one 1.35× and 1.40×, covering within a point of it on both of the benchmarks'
    processes (docs/reports.md#the-jackknife-metrics-students-t-skew-corrected-issue-46-2026-12-06);
    self-BLEU's, on its own scale since, 1.19×."""
    G = len(pseudo)
    se = float(np.std(pseudo, ddof=1)) / math.sqrt(G)
    if not (math.isfinite(se) and math.isfinite(center)):
        return None
    if se == 0:
        return center, center
    q = float(sps.t.ppf((1 + CI_LEVEL) / 2, G - 1))
    gamma = float(sps.skew(pseudo, bias=False)) if G > 2 else 0.0
    shift = -gamma * (2 * q * q + 1) / (6 * math.sqrt(G)) if math.isfinite(gamma) else 0.0
    return center - (q + max(shift, 0.0)) * se, center + (q + max(-shift, 0.0)) * se


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
    reps = np.array([as_float(metric.fn(cell.subset([i for g in d for i in groups[g]]))) for d in draws])
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
    keep_items: dict[str, UnionItems | OverlapItems | CountItems] | None = None,
    stats: dict[str, np.ndarray | None] | None = None,
) -> dict[str, tuple[float, float, str]]:
    """95% intervals over prompt resamples: {metric: (low, high, method)}; see the module doc.

    `n_boot`: the bootstrap's replicates; `n_boot_corpus`: the half-sample's (at most n_boot).
    A replicate always keeps all of a drawn prompt's generations (every seed) together.
    `keep`, if given, receives what paired comparisons need, per metric: ("sums", the (G, k)
    per-prompt statistics) of a bootstrap metric, ("loo", the G leave-one-out values) of a
    jackknife one, in the order of `groups`; `keep_items` a union metric's items and a plain one's swap items
    (`jackknife`).
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
            interval = jackknife(metric, cell, value, groups, keep=keep, keep_items=keep_items)
        elif metric.interval == "half-sample":
            interval = half_sample(metric, cell, value, groups, n_reps=min(n_boot, n_boot_corpus), rng=rng)
        else:
            continue
        if interval is not None:
            out[name] = (*bounded(interval, metric.bounds), metric.interval)
    return out


def prompt_groups(keys: list[str]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def cell_rng(seed: int, cell: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(cell.encode())])
