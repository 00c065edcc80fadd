"""Comparing two sweeps' summaries cell by cell (`decodebench report A --compare B`)."""

from __future__ import annotations

import pandas as pd

from controller.report.compute.columns import KEY_COLUMNS, SAMPLES_COLUMNS
from controller.report.stats.paired import is_comparison_column


def compare(summary_a: pd.DataFrame, summary_b: pd.DataFrame) -> pd.DataFrame:
    """Per-cell differences B - A, cells matched on (model, strategy, params).

    Columns: model, strategy, params, `present` (both, a, b), then `<col>_delta` for
    every numeric column the two share (CI and paired-comparison columns excepted), then `<col>_a`, `<col>_b`.
    """

    def keyed(s: pd.DataFrame) -> pd.DataFrame:
        s = s.copy()
        s["model"] = s["model"].astype(object).where(s["model"].notna(), "")
        return s

    a, b = keyed(summary_a), keyed(summary_b)
    # sweeps with several engines (docs/engines.md) match cells on the engine too; the own engine's label
    # stands for a summary without the column
    keys = list(KEY_COLUMNS)
    if "engine" in a.columns or "engine" in b.columns:
        for s in (a, b):
            s["engine"] = s["engine"].fillna("decodebench") if "engine" in s.columns else "decodebench"
        keys.append("engine")
    for column in SAMPLES_COLUMNS:  # a variant with samples is a cell of its own (docs/sweeps.md#samples)
        if column in a.columns or column in b.columns:
            for s in (a, b):
                s[column] = s[column].astype(object).where(s[column].notna(), "") if column in s.columns else ""
            keys.append(column)
    shared = [
        c
        for c in a.columns
        if c in b.columns
        and c not in keys
        and "_ci_" not in c
        and not is_comparison_column(c)  # a sweep's own paired comparisons are not compared across sweeps
        and pd.api.types.is_numeric_dtype(a[c])
        and pd.api.types.is_numeric_dtype(b[c])
    ]
    merged = a[keys + shared].merge(
        b[keys + shared], on=keys, how="outer", suffixes=("_a", "_b"), indicator=True, sort=False
    )
    out = merged[keys].copy()
    out["present"] = merged["_merge"].map({"both": "both", "left_only": "a", "right_only": "b"}).astype(object)
    deltas = {f"{c}_delta": merged[f"{c}_b"].astype(float) - merged[f"{c}_a"].astype(float) for c in shared}
    sides = {f"{c}_{side}": merged[f"{c}_{side}"] for c in shared for side in ("a", "b")}
    out = pd.concat([out, pd.DataFrame(deltas), pd.DataFrame(sides)], axis=1)
    for column in ["model", *(c for c in SAMPLES_COLUMNS if c in keys)]:  # the merge's blanks: None again
        out[column] = out[column].where(out[column] != "", None)
    return out.reset_index(drop=True)
