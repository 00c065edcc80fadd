"""Cell metrics and their 95% confidence intervals over prompt resamples.

`evaluate` computes every requested metric of one cell (NaN where it does not apply);
`confidence_intervals` resamples prompts (all seeds of a prompt together), by the
method each metric declares when it registers (`Metric.interval`, see
`controller.metrics`): a percentile bootstrap from the per-generation statistics of an
additive metric, a delete-half jackknife calling `fn` for the other corpus metrics.
Nothing here knows any metric. docs/reports.md explains both methods.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from controller.metrics import CellData, Metric

CI_LEVEL = 0.95
Z = NormalDist().inv_cdf((1 + CI_LEVEL) / 2)
PERCENTILES = [(1 - CI_LEVEL) / 2 * 100, (1 + CI_LEVEL) / 2 * 100]


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


def evaluate(metrics: list[tuple[str, Metric]], cell: CellData, *, reference_row: bool = False) -> dict[str, float]:
    """Every metric of one cell: a float, NaN where it does not apply."""
    return {
        name: _num(m.fn(cell)) if applicable(m, cell, reference_row=reference_row) else math.nan for name, m in metrics
    }


# -- confidence intervals ------------------------------------------------------------------


def _percentile_interval(reps: np.ndarray) -> tuple[float, float] | None:
    ok = reps[~np.isnan(reps)]
    if len(ok) < len(reps) / 2:
        return None
    lo, hi = np.percentile(ok, PERCENTILES)
    return float(lo), float(hi)


def bootstrap(metric: Metric, cell: CellData, counts: np.ndarray, member: np.ndarray) -> tuple[float, float] | None:
    """Percentile interval of an additive metric from its per-generation statistics.

    `counts[b, g]`: how often replicate b drew prompt g; `member[g, i]`: 1 where
    generation i belongs to prompt g. A replicate's column sums are its counts times the
    prompts' summed statistics, and its value is `metric.combine` of them: what the metric
    gives on the replicate's generations, without recomputing any statistic.
    """
    stats = metric.stats(cell)
    if stats is None:
        return None
    sums = counts @ (member @ stats)
    return _percentile_interval(np.array([_num(metric.combine(row.tolist())) for row in sums]))


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
) -> dict[str, tuple[float, float, str]]:
    """95% intervals over prompt resamples: {metric: (low, high, method)}; see docs/reports.md.

    Each metric's declared `interval` picks the method:

    - `bootstrap` (additive metrics: means and ratios of per-generation sums): percentile
      bootstrap, `n_boot` replicates; a replicate draws len(groups) prompts with
      replacement and keeps all their generations (every seed).
    - `half-sample` (the other corpus metrics, e.g. distinct-n, self-BLEU, Zipf, whose
      value a resample's duplicated generations would distort): a delete-half jackknife,
      min(n_boot, n_boot_corpus) replicates of m = G // 2 prompts drawn without
      replacement; the standard error is their standard deviation times sqrt(m / (G - m))
      (for a mean, exactly the full-sample standard error) and the interval estimate ± 1.96 SE.
    - `none`: no interval.
    """
    G = len(groups)
    if G < 2 or n_boot < 1:
        return {}
    counts = rng.multinomial(G, np.full(G, 1.0 / G), size=n_boot)  # resampled prompt counts
    member = np.zeros((G, len(cell.texts)))
    for g, items in enumerate(groups):
        member[g, items] = 1.0
    out = {}
    for name, metric in metrics:
        value = values.get(name, math.nan)
        if math.isnan(value) or not applicable(metric, cell, reference_row=reference_row):
            continue
        if metric.interval == "bootstrap":
            interval = bootstrap(metric, cell, counts, member)
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
