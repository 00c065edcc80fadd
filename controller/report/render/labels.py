"""A summary's rows labelled as every view of the report names them: `variant_labels`, `cell_labels` and
`labeller` read a summary (or a comparison of two) and give each row the label of
`controller.sweep.labels`, the one rule (the parameters that tell a strategy's variants apart)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from controller.report.compute.columns import REFERENCE
from controller.sweep.labels import Variant, label_variants
from worker.strategies import samples_label


def row_params(row) -> dict:
    """A summary row's strategy parameters (its `params` column, JSON), {} where it has none or they do not parse."""
    try:
        loaded = json.loads(row.get("params") or "{}")
    except (TypeError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _row_variant(row, drop: Sequence[str]) -> Variant:
    samples = row.get("samples") if hasattr(row, "get") else None
    suffix = ""
    if samples is not None and not pd.isna(samples):
        best_of = row.get("best_of")
        suffix = samples_label(int(samples), best_of if isinstance(best_of, str) else None)
    engine = row.get("engine") if hasattr(row, "get") else None  # a column only where a sweep runs several engines
    params = tuple((k, v) for k, v in row_params(row).items() if k not in drop)
    return Variant(str(row["strategy"]), params, suffix, engine if isinstance(engine, str) else "")


def variant_labels(frame: pd.DataFrame, drop: Sequence[str] = ()) -> list[str]:
    """Each row's variant label (`top_p(p=0.9)`; the reference row `reference`), in row order; `drop` names
    parameters left out of every label (the accuracy-against-temperature chart's lines leave out temperature)."""
    rows = [r for _, r in frame.iterrows()]
    cells = [i for i, r in enumerate(rows) if r["strategy"] != REFERENCE]
    labels = label_variants([_row_variant(rows[i], drop) for i in cells])
    out = [REFERENCE] * len(rows)
    for i, label in zip(cells, labels):
        out[i] = label
    return out


def several_models(frame: pd.DataFrame) -> bool:
    return frame.loc[frame["strategy"] != REFERENCE, "model"].dropna().nunique() > 1


def cell_labels(frame: pd.DataFrame, with_model: bool | None = None, drop: Sequence[str] = ()) -> list[str]:
    """Each row's `model · variant` (`austen-tiny · top_p(p=0.9)`), the model only where the sweep has several
    (or as `with_model` says); the reference row `reference`; `drop` as `variant_labels`'."""
    with_model = several_models(frame) if with_model is None else with_model
    return [
        f"{row['model']} · {variant}" if with_model and variant != REFERENCE else variant
        for variant, (_, row) in zip(variant_labels(frame, drop), frame.iterrows())
    ]


def labeller(frame: pd.DataFrame, with_model: bool | None = None) -> Callable[[Any], str]:
    """A row of `frame` (from its iterrows) -> its cell label, for the tables that label rows one by one."""
    labels = dict(zip(frame.index, cell_labels(frame, with_model)))
    return lambda row: labels[row.name]
