"""Cell metrics and their 95% confidence intervals over prompt resamples.

`evaluate` computes every requested metric of one cell (NaN where it does not apply);
`confidence_intervals` resamples prompts (all seeds of a prompt together), by the
method each metric declares when it registers (`Metric.interval`, see
`controller.metrics`):

- "bootstrap" (additive metrics): the BCa bootstrap of `scipy.stats.bootstrap` over prompts,
  vectorised: scipy resamples prompt indices, a replicate's value is `combine` of the drawn
  prompts' summed per-generation statistics (exactly the metric on those generations);
- "jackknife" (plain corpus metrics): the delete-one-prompt jackknife, from the metric's own
  exact `leave_one_out` where it declares one, else `fn` on the cell without each prompt;
  estimate ± t(G-1) · SE;
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

from controller.metrics import CellData, Metric, ratio

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


# -- the bootstrap of additive metrics ------------------------------------------------------


def prompt_sums(stats: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """(G, k): each prompt's summed per-generation statistics."""
    return np.stack([stats[list(items)].sum(axis=0) for items in groups])


def combine_many(combine: Callable, sums: np.ndarray) -> np.ndarray:
    """`combine` of every row of sums (..., k): the metric's values, NaN where empty."""
    flat = sums.reshape(-1, sums.shape[-1])
    return np.array([_num(combine(row)) for row in flat.tolist()]).reshape(sums.shape[:-1])


def resampled_statistic(per_prompt: np.ndarray, combine: Callable) -> Callable:
    """The statistic scipy resamples: prompt indices (..., G) -> combine of the drawn prompts' sums."""

    def statistic(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        idx = np.moveaxis(np.asarray(idx, dtype=np.intp), axis, -1)
        return combine_many(combine, per_prompt[idx].sum(axis=-2))

    return statistic


def ratio_statistic(per_unit: np.ndarray) -> Callable:
    """Vectorised statistic over resampled unit indices: Σ column 0 / Σ column 1 (a mean or a ratio)."""

    def statistic(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        drawn = per_unit[np.moveaxis(np.asarray(idx, dtype=np.intp), axis, -1)].sum(axis=-2)
        with np.errstate(invalid="ignore", divide="ignore"):
            return drawn[..., 0] / drawn[..., 1]

    return statistic


def bca(statistic: Callable, n: int, *, n_boot: int, rng: np.random.Generator) -> tuple[float, float] | None:
    """BCa 95% interval of `statistic` over n resampled units (scipy.stats.bootstrap, vectorised).

    Where BCa is undefined (every replicate equal, or NaN replicates) the percentile interval of
    the finite replicates stands in; None when fewer than half of them are finite."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore")  # degenerate data: handled below
        res = sps.bootstrap(
            (np.arange(n),),
            statistic,
            n_resamples=n_boot,
            vectorized=True,
            method="BCa",
            confidence_level=CI_LEVEL,
            rng=rng,
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isfinite(lo) and math.isfinite(hi):
        return lo, hi
    reps = np.asarray(res.bootstrap_distribution, dtype=float)
    ok = reps[np.isfinite(reps)]
    if len(ok) < len(reps) / 2:
        return None
    low, high = np.percentile(ok, PERCENTILES)
    return float(low), float(high)


def bootstrap(
    metric: Metric, cell: CellData, groups: Sequence[Sequence[int]], *, n_boot: int, rng: np.random.Generator
) -> tuple[float, float] | None:
    """BCa interval of an additive metric over prompts, from its per-generation statistics."""
    stats = metric.stats(cell)
    if stats is None:
        return None
    per_prompt = prompt_sums(stats, groups)
    statistic = (
        ratio_statistic(per_prompt) if metric.combine is ratio else resampled_statistic(per_prompt, metric.combine)
    )
    return bca(statistic, len(groups), n_boot=n_boot, rng=rng)


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


def t_quantile(G: int) -> float:
    return float(sps.t.ppf((1 + CI_LEVEL) / 2, G - 1))


def jackknife(
    metric: Metric, cell: CellData, value: float, groups: Sequence[Sequence[int]]
) -> tuple[float, float] | None:
    """Delete-one-prompt jackknife: estimate ± t(G-1) · SE; None where a leave-one-out value is empty."""
    loo = leave_one_out(metric, cell, groups)
    if np.isnan(loo).any():
        return None
    half = t_quantile(len(groups)) * jackknife_se(loo)
    return value - half, value + half


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
    """95% intervals over prompt resamples: {metric: (low, high, method)}; see the module doc.

    `n_boot`: the bootstrap's replicates; `n_boot_corpus`: the half-sample's (at most n_boot).
    A replicate always keeps all of a drawn prompt's generations (every seed) together.
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
            interval = bootstrap(metric, cell, groups, n_boot=n_boot, rng=rng)
        elif metric.interval == "jackknife":
            interval = jackknife(metric, cell, value, groups)
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
