"""Writing a sweep's reports through the store: summary.{csv,parquet,json,md} and report.html
under `report/`, and the comparison of two sweeps."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pandas as pd

from controller.report.load.sweep import SweepData
from controller.report.render.format import compare_table, summary_markdown
from worker.core import paths
from worker.core.errors import UsageError
from worker.core.safetext import csv_cell
from worker.store import Store

FORMATS = tuple(paths.REPORT_FILES)


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """A DataFrame as CSV that a spreadsheet opens safely: every text cell through `csv_cell`
    (a name, params or prompt starting with `=`, `+`, `-`, `@` gets a leading `'`); numbers stay numbers."""
    safe = frame.copy()
    for col in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[col]):
            safe[col] = safe[col].map(csv_cell)
    return safe.to_csv(index=False).encode()


def json_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame's rows for JSON at full precision: each float as Python's repr writes it (the shortest text that
    reads back to the same double), NaN and infinities as null. pandas' `to_json` rounds to at most 15 decimal
    *places*, which wrote a p-value of 4.696894622322827e-10 as 4.69689e-10 (and so Holm's adjustments no longer
    followed from the file's own p-values)."""

    def plain(v: Any) -> Any:
        if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
            v = v.item()  # a numpy scalar
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if v is pd.NA or v is pd.NaT:
            return None
        return v

    return [{str(k): plain(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def summary_json(summary: pd.DataFrame, data: SweepData) -> str:
    return json.dumps(
        {
            "sweep_id": data.sweep_id,
            "tenant": data.tenant,
            "name": data.name,
            "ci": summary.attrs.get("ci"),
            "no_ci": summary.attrs.get("no_ci"),  # why there are no intervals, where there are none
            "mauve": summary.attrs.get("mauve"),
            "columns": list(summary.columns),
            "rows": json_records(summary),
        },
        indent=2,
    )


def render(fmt_name: str, summary: pd.DataFrame, data: SweepData, print_samples: bool | None = None) -> bytes:
    """One format's bytes; `print_samples` is report.html's (html.render_html; None: by the sweep's size)."""
    if fmt_name == "csv":
        return csv_bytes(summary)
    if fmt_name == "parquet":
        buf = io.BytesIO()
        summary.to_parquet(buf, index=False)
        return buf.getvalue()
    if fmt_name == "json":
        return summary_json(summary, data).encode()
    if fmt_name == "md":
        return summary_markdown(summary, data).encode()
    if fmt_name == "html":
        from controller.report.render.html import render_html  # plotly only where the HTML is made

        return render_html(summary, data, print_samples).encode()
    raise UsageError(f"unknown report format {fmt_name!r}; valid: {', '.join(FORMATS)}")


def write_reports(
    store: Store,
    tenant: str,
    sweep_id: str,
    summary: pd.DataFrame,
    data: SweepData,
    formats: tuple[str, ...] = FORMATS,
    print_samples: bool | None = None,
) -> dict[str, str]:
    """Write every format under the sweep's `report/`; return {format: store key}."""
    keys = {}
    for name in formats:
        key = paths.report_key(tenant, sweep_id, paths.REPORT_FILES[name])
        store.write_bytes(key, render(name, summary, data, print_samples))
        keys[name] = key
    return keys


def write_comparison(store: Store, tenant: str, sweep_a: str, sweep_b: str, comparison: pd.DataFrame) -> dict[str, str]:
    keys = {}
    for name, body in (("csv", csv_bytes(comparison)), ("md", compare_table(comparison).encode())):
        key = paths.report_key(tenant, sweep_a, f"compare-{sweep_b}.{name}")
        store.write_bytes(key, body)
        keys[name] = key
    return keys


def comparison_bytes(fmt_name: str, comparison: pd.DataFrame) -> bytes:
    if fmt_name == "csv":
        return csv_bytes(comparison)
    if fmt_name == "json":
        return json.dumps(json_records(comparison), indent=2).encode()
    if fmt_name == "parquet":
        buf = io.BytesIO()
        comparison.to_parquet(buf, index=False)
        return buf.getvalue()
    return compare_table(comparison).encode()
