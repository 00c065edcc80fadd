"""Cell metrics and their 95% confidence intervals over prompt resamples.

`evaluate` computes every requested metric of one cell (NaN where it does not apply);
`confidence_intervals` resamples prompts (all seeds of a prompt together): an exact,
fast percentile bootstrap where a metric is a function of per-generation sums, a
delete-half jackknife for the other corpus metrics. docs/reports.md explains both.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from statistics import NormalDist
from typing import Any

import numpy as np

from controller.metrics import CellData, Metric
from controller.metrics.tokenize import ngrams

CI_LEVEL = 0.95
Z = NormalDist().inv_cdf((1 + CI_LEVEL) / 2)

def _num(value: Any) -> float:
    """A metric value as a float; None, non-numbers and non-finite values become NaN."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan

def subset(cell: CellData, idx: list[int] | np.ndarray) -> CellData:
    """The cell's data restricted (with repetition) to the generations `idx`."""
    def pick(values: list) -> list:
        return [values[i] for i in idx] if len(values) == len(cell.texts) else []

    return CellData(
        texts=pick(cell.texts), words=pick(cell.words), references=pick(cell.references),
        n_new_tokens=pick(cell.n_new_tokens), stop_reasons=pick(cell.stop_reasons),
        nll_sum=pick(cell.nll_sum), nll_count=pick(cell.nll_count), token_ids=pick(cell.token_ids),
    )


def applicable(metric: Metric, cell: CellData, *, reference_row: bool = False) -> bool:
    """False where a metric cannot apply: then its value is empty without calling it."""
    if reference_row and (metric.needs_references or metric.needs_model):
        return False
    if metric.needs_references and not any(r for r in cell.references):
        return False
    return bool(cell.texts)


def evaluate(metrics: list[tuple[str, Metric]], cell: CellData, *, reference_row: bool = False) -> dict[str, float]:
    """Every metric of one cell: a float, NaN where it does not apply."""
    return {name: _num(m.fn(cell)) if applicable(m, cell, reference_row=reference_row) else math.nan
            for name, m in metrics}


# -- confidence intervals ------------------------------------------------------------------
# Fast paths: a metric that is a function of per-generation statistics summed over the
# cell is bootstrapped exactly and fast (weights x statistics). A fast path is used only
# after it reproduces the registered metric on the whole cell and on two resamples.

def _ngram_stats(cell: CellData, ns: tuple[int, ...]) -> np.ndarray:
    rows = []
    for words in cell.words:
        row = []
        for n in ns:
            grams = ngrams(words, n)
            row += [len(set(grams)), len(grams)]
        rows.append(row)
    return np.array(rows, dtype=float).reshape(len(cell.words), 2 * len(ns))


def _bleu_stats(cell: CellData) -> np.ndarray:
    from sacrebleu.metrics import BLEU

    bleu, out = BLEU(), np.zeros((len(cell.texts), 10))
    pairs = [(i, t, r) for i, (t, r) in enumerate(zip(cell.texts, cell.references)) if r is not None]
    if pairs:
        stats = bleu._extract_corpus_statistics([t for _, t, _ in pairs], [[r for _, _, r in pairs]])
        out[[i for i, _, _ in pairs]] = np.array(stats, dtype=float)
    return out


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def _bleu_score(s: np.ndarray) -> float:
    from sacrebleu.metrics import BLEU

    return float(BLEU()._compute_score_from_stats([int(round(x)) for x in s]).score) if s[0] > 0 else math.nan


FAST_PATHS: dict[str, tuple[Callable, Callable]] = {
    **{f"rep_{n}": (lambda c, n=n: _ngram_stats(c, (n,)), lambda s: 1.0 - _ratio(s[0], s[1])) for n in (2, 3, 4)},
    "diversity": (lambda c: _ngram_stats(c, (2, 3, 4)),
                  lambda s: float(np.prod([_ratio(s[i], s[i + 1]) for i in (0, 2, 4)]))),
    "perplexity": (lambda c: np.array([[a, b] for a, b in zip(c.nll_sum, c.nll_count)], dtype=float)
                   if len(c.nll_sum) == len(c.texts) and None not in c.nll_sum + c.nll_count else None,
                   lambda s: math.exp(_ratio(s[0], s[1]))),
    "bleu": (_bleu_stats, _bleu_score),
}


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def fast_paths(metrics: list[tuple[str, Metric]], cell: CellData, values: dict[str, float],
               rng: np.random.Generator) -> dict[str, tuple[np.ndarray, Callable]]:
    """{metric: (per-generation statistics, combine)} for the metrics a fast path reproduces.

    Besides FAST_PATHS, any metric that is the mean of its per-generation values (ROUGE,
    lengths, rates) is found by evaluating it on each generation alone, generation by
    generation for all metrics at once (so metrics that share a computation share a cache).
    """
    n = len(cell.texts)
    candidates = {name: FAST_PATHS[name] for name, _ in metrics if name in FAST_PATHS}
    means = [(name, m) for name, m in metrics if name not in FAST_PATHS]
    per_item = {name: np.zeros((n, 2)) for name, _ in means}
    for i in range(n):
        one = subset(cell, [i])
        for name, m in means:
            v = _num(m.fn(one))
            per_item[name][i] = (0.0, 0.0) if math.isnan(v) else (v, 1.0)
    for name, _ in means:
        candidates[name] = (lambda c, stats=per_item[name]: stats, lambda s: _ratio(s[0], s[1]))
    check = rng.integers(0, n, size=min(n, 24))
    small = subset(cell, check)
    out = {}
    for name, m in metrics:
        stats_fn, combine = candidates[name]
        try:
            stats = stats_fn(cell)
            if (stats is not None and _close(combine(stats.sum(axis=0)), values[name])
                    and _close(combine(stats[check].sum(axis=0)), _num(m.fn(small)))):
                out[name] = (stats, combine)
        except (ArithmeticError, ValueError, TypeError, IndexError):
            continue
    return out


def confidence_intervals(
    metrics: list[tuple[str, Metric]], cell: CellData, values: dict[str, float], groups: list[list[int]], *,
    n_boot: int, n_boot_corpus: int, rng: np.random.Generator, reference_row: bool = False,
) -> dict[str, tuple[float, float, str]]:
    """95% intervals over prompt resamples: {metric: (low, high, method)}; see docs/reports.md.

    - `bootstrap` (metrics with a fast path: means and ratios of per-generation sums):
      percentile bootstrap; a replicate draws len(groups) prompts with replacement and
      keeps all their generations (every seed).
    - `half-sample` (the other corpus metrics, e.g. distinct-n, self-BLEU, Zipf, whose
      value a resample's duplicated generations would distort): a delete-half jackknife,
      `n_boot_corpus` replicates of m = G // 2 prompts drawn without replacement; the
      standard error is their standard deviation times sqrt(m / (G - m)) (for a mean,
      exactly the full-sample standard error) and the interval estimate ± 1.96 SE.
    """
    G = len(groups)
    if G < 2 or n_boot < 1:
        return {}
    weights = rng.multinomial(G, np.full(G, 1.0 / G), size=n_boot)  # resampled prompt counts
    member = np.zeros((G, len(cell.texts)))
    for g, items in enumerate(groups):
        member[g, items] = 1.0
    q = [(1 - CI_LEVEL) / 2 * 100, (1 + CI_LEVEL) / 2 * 100]
    metrics = [(name, m) for name, m in metrics if not math.isnan(values.get(name, math.nan))
               and applicable(m, cell, reference_row=reference_row)]
    paths_ = fast_paths(metrics, cell, values, rng)
    out = {}
    for name, metric in metrics:
        value = values[name]
        path = paths_.get(name)
        if path is not None:
            stats, combine = path
            reps = np.array([combine(row) for row in weights @ (member @ stats)])
            method = "bootstrap"
        else:  # delete-half jackknife: no duplicated generations; normal interval from its SE
            m = G // 2
            draws = [rng.choice(G, size=m, replace=False) for _ in range(min(n_boot, n_boot_corpus))]
            reps = np.array([_num(metric.fn(subset(cell, [i for g in d for i in groups[g]]))) for d in draws])
            ok = reps[~np.isnan(reps)]
            if len(ok) >= max(2, len(reps) / 2):
                half = Z * float(np.std(ok, ddof=1)) * math.sqrt(m / (G - m))
                out[name] = (value - half, value + half, "half-sample")
            continue
        ok = reps[~np.isnan(reps)]
        if len(ok) >= len(reps) / 2:
            lo, hi = np.percentile(ok, q)
            out[name] = (float(lo), float(hi), method)
    return out


def _prompt_groups(keys: list[str]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _rng(seed: int, cell: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(cell.encode())])
