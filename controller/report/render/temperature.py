"""report.html's accuracy-against-temperature figure (the min-p paper's, Nguyen et al. 2024, figure 1).

For a sweep with a temperature grid: one line per strategy variant (its parameters but temperature),
per model, through its cells' accuracy at each temperature, the 95% interval over prompts as error
bars; a strategy without a temperature (greedy, beam search) is a dashed horizontal line across the
grid. A menu switches between the task metrics the sweep has (exact_match, maj@k, pass@k).
Presentation only: the numbers are the summary's."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from controller.report.compute.columns import REFERENCE
from controller.report.render.labels import cell_labels, row_params
from controller.report.render.marks import PALETTE
from controller.report.render.plots import inert

TASK_PREFIXES = ("maj@", "pass@")


def task_metrics(summary: pd.DataFrame) -> list[str]:
    """exact_match, then the maj@k and pass@k columns, that have a value."""
    names = ["exact_match"] + sorted(c for c in summary.columns if c.startswith(TASK_PREFIXES) and "_" not in c)
    return [m for m in names if m in summary.columns and summary[m].notna().any()]


def _temperature(row) -> float | None:
    t = row_params(row).get("temperature")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def _errors(group: pd.DataFrame, m: str) -> dict | None:
    if f"{m}_ci_low" not in group.columns or not group[f"{m}_ci_low"].notna().any():
        return None
    y, lo, hi = (group[c].astype(float) for c in (m, f"{m}_ci_low", f"{m}_ci_high"))
    return {
        "type": "data",
        "symmetric": False,
        "array": (hi - y).fillna(0).tolist(),
        "arrayminus": (y - lo).fillna(0).tolist(),
    }


def _traces(cells: pd.DataFrame, m: str, span: tuple[float, float], lines: dict) -> list[dict]:
    rows = cells[cells[m].notna()].copy()
    rows["_t"] = [_temperature(r) for _, r in rows.iterrows()]
    rows["_line"] = [lines[i] for i in rows.index]
    traces = []
    for n, (label, group) in enumerate(rows.groupby("_line", sort=False)):
        color = PALETTE[n % len(PALETTE)]
        swept = group[group["_t"].notna()].sort_values("_t")
        if not swept.empty:
            trace: dict[str, Any] = {
                "type": "scatter",
                "mode": "lines+markers",
                "name": inert(label),
                "x": swept["_t"].tolist(),
                "y": swept[m].astype(float).tolist(),
                "line": {"color": color},
                "marker": {"color": color},
                "hovertemplate": inert(label) + "<br>temperature %{x}<br>" + m + " %{y:.3f}<extra></extra>",
            }
            if (errors := _errors(swept, m)) is not None:
                trace["error_y"] = errors
            traces.append(trace)
        for _, row in group[group["_t"].isna()].iterrows():  # no temperature: the same at every one
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "name": inert(label),
                    "x": list(span),
                    "y": [float(row[m])] * 2,
                    "line": {"color": color, "dash": "dash"},
                    "hovertemplate": inert(label) + "<br>" + m + " %{y:.3f}<extra></extra>",
                }
            )
    return traces


def accuracy_temperature_figure(summary: pd.DataFrame) -> dict | None:
    """Plotly figure (a dict) of the task metrics against temperature; None without a task metric or a grid of
    at least two temperatures."""
    cells = summary[summary["strategy"] != REFERENCE]
    metrics = task_metrics(cells)
    temps = sorted({t for _, r in cells.iterrows() if (t := _temperature(r)) is not None and math.isfinite(t)})
    if not metrics or len(temps) < 2:
        return None
    # a line per variant without its temperature (the model's name first where there are several)
    lines = dict(zip(summary.index, cell_labels(summary, drop=("temperature",))))
    traces: list[dict] = []
    spans = []
    for n, m in enumerate(metrics):
        start = len(traces)
        traces += _traces(cells, m, (temps[0], temps[-1]), lines)
        for t in traces[start:]:
            t["visible"] = n == 0
        spans.append((start, len(traces) - start))
    buttons = [
        {
            "label": m,
            "method": "update",
            "args": [{"visible": [s <= i < s + c for i in range(len(traces))]}, {"yaxis.title.text": m}],
        }
        for m, (s, c) in zip(metrics, spans)
    ]
    layout = {
        "title": {"text": "Accuracy against temperature (95% intervals over prompts)", "x": 0.5},
        "xaxis": {"title": {"text": "temperature"}},
        "yaxis": {"title": {"text": metrics[0]}, "range": [0, 1.02]},
        "margin": {"t": 70, "l": 60, "r": 20, "b": 50},
        "height": 460,
        "legend": {"orientation": "h", "y": -0.15, "yanchor": "top"},
        "updatemenus": [{"buttons": buttons, "x": 0, "y": 1.0, "yanchor": "bottom", "xanchor": "left"}],
    }
    return {"data": traces, "layout": layout}
