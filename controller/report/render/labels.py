"""Labels of a report's cells: a strategy variant shows every parameter that varies in the sweep.

A grid `top_p: {p: [0.8, 0.9, 0.95]}` is labelled `top_p(p=0.8)`, `top_p(p=0.9)`, `top_p(p=0.95)`:
a parameter is left out only where it has its default and every cell of the strategy has the same
value, so two cells never share a label and a default never hides in a sweep over it."""

from __future__ import annotations

import json

import pandas as pd

from controller.report.compute.columns import REFERENCE
from worker.strategies import STRATEGIES, samples_label


def _params(row) -> dict:
    try:
        loaded = json.loads(row["params"] or "{}")
    except (TypeError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def varying_params(summary: pd.DataFrame) -> dict[str, set[str]]:
    """strategy -> the names of its parameters whose value differs between its cells."""
    seen: dict[str, dict[str, set[str]]] = {}
    counts: dict[str, int] = {}
    for _, row in summary.iterrows():
        strategy = row["strategy"]
        counts[strategy] = counts.get(strategy, 0) + 1
        for k, v in _params(row).items():
            seen.setdefault(strategy, {}).setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    out: dict[str, set[str]] = {}
    for strategy, by_key in seen.items():
        rows = summary[summary["strategy"] == strategy]
        present = {k: sum(k in _params(r) for _, r in rows.iterrows()) for k in by_key}
        out[strategy] = {k for k, values in by_key.items() if len(values) > 1 or present[k] < counts[strategy]}
    return out


def variant_label(row, varying: dict[str, set[str]] | None = None) -> str:
    """`top_p(p=0.9)`: the parameters that differ from their default or vary in the sweep."""
    if row["strategy"] == REFERENCE:
        return REFERENCE
    strategy = row["strategy"]
    spec = STRATEGIES.get(strategy) if strategy in STRATEGIES else None
    vary = (varying or {}).get(strategy, set())

    def shown(k, v) -> bool:
        return k in vary or spec is None or k not in spec.all_params or spec.all_params[k].default != v

    params = {k: v for k, v in _params(row).items() if shown(k, v)}
    variant = strategy + (f"({','.join(f'{k}={v}' for k, v in params.items())})" if params else "")
    variant += _samples(row)
    engine = row.get("engine") if hasattr(row, "get") else None  # only where a sweep runs several engines
    return f"{variant} @ {engine}" if isinstance(engine, str) and engine else variant


def _samples(row) -> str:
    """A cell's samples after its variant (`[samples=8]`), where the summary has them (docs/sweeps.md#samples)."""
    samples = row.get("samples") if hasattr(row, "get") else None
    if samples is None or pd.isna(samples):
        return ""
    best_of = row.get("best_of")
    return samples_label(int(samples), best_of if isinstance(best_of, str) else None)


def cell_label(row, varying: dict[str, set[str]] | None = None, with_model: bool = True) -> str:
    """`model · strategy(params)`, e.g. `austen-tiny · top_p(p=0.9)`."""
    variant = variant_label(row, varying)
    return f"{row['model']} · {variant}" if with_model and variant != REFERENCE else variant
