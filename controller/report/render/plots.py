"""report.html's figures (plotly dicts): quality vs speed with its Pareto front, and a bar chart
per metric. Presentation only: the numbers come from the summary as they are.

Quality vs speed: one trace per strategy variant, its symbol the strategy and its colour the
variant, one legend entry each (a click hides the variant everywhere); labels on hover only, so
that a cluster of 40 cells stays readable; with several models, one panel per model (small
multiples) on a shared speed axis. Bars run horizontally, one labelled row per cell, so that long
labels never collide."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from controller.metrics import METRICS
from controller.report.compute.columns import REFERENCE
from controller.report.render.format import metric_columns
from controller.report.render.labels import cell_labels, variant_labels
from controller.report.render.marks import (
    BELOW_AXIS_PX,
    LABEL_FONT,
    NOMINAL_WIDTH,
    PAGE_HEIGHT,
    encoding,
    legends,
    place_labels,
    place_legends,
)

SPEED = {
    "tokens_per_s": True,
    "latency_ms_p50": False,
    "latency_ms_p95": False,
    "ttft_ms_p50": False,
    "peak_memory_mb": False,
}
SPEED_CI = ["tokens_per_s_ci_low", "tokens_per_s_ci_high"]
PANEL_COLUMNS = 3
PANEL_HEIGHT = 420
MIN_PANEL_HEIGHT = 260
GAPS = (0.2, 0.3)  # the panels' grid: plotly's xgap and ygap of an independent grid
MARGIN = {"t": 70, "l": 60, "r": 20}


def inert(text: str) -> str:
    """A user's string as plotly text: plotly reads a subset of HTML in every label (`<a href>` a live link,
    `<b>`, `<br>`), and draws entities as their characters, so `<`, `>` and `&` as entities read as written."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _f(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def pareto_front(xs: list[float], ys: list[float], *, y_higher_is_better: bool) -> list[int]:
    """Indices of the points no other point beats on both speed (higher x) and quality."""
    sign = 1.0 if y_higher_is_better else -1.0
    front = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        dominated = any(
            xj >= x and sign * yj >= sign * y and (xj > x or sign * yj > sign * y)
            for j, (xj, yj) in enumerate(zip(xs, ys))
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: xs[i])


def _direction(name: str) -> bool | None:
    return METRICS.get(name).higher_is_better if name in METRICS else None


def axis_title(m: str) -> str:
    direction = SPEED.get(m, _direction(m))
    return m + ("" if direction is None else " (higher is better)" if direction else " (lower is better)")


def _speed_bars(sub: pd.DataFrame) -> dict:
    lo, hi, x = (sub.get(c, pd.Series(math.nan, index=sub.index)).astype(float) for c in SPEED_CI + ["tokens_per_s"])
    return {
        "type": "data",
        "symmetric": False,
        "array": (hi - x).fillna(0).tolist(),
        "arrayminus": (x - lo).fillna(0).tolist(),
    }


def _y_range(cells: pd.DataFrame, ref: pd.DataFrame, m: str) -> list[float]:
    """The metric's axis range, shared by the panels (set, so that the direct labels know where points fall)."""
    ys = [float(y) for y in cells[m].dropna()] + [float(y) for y in ref[m].dropna()]
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
    return [lo - pad, hi + pad]


def _panel_traces(sub: pd.DataFrame, ref: pd.DataFrame, m: str, k: int, look: dict, panel: dict) -> list[dict]:
    """One model's panel (axes x{k}, y{k}): a trace per variant with its direct labels, the Pareto front, the
    reference. `look`: the markers, legends and labels of the sweep; `panel`: its ranges and size in px."""
    axes = {"xaxis": f"x{k + 1 if k else ''}", "yaxis": f"y{k + 1 if k else ''}"}
    sub = sub[sub[m].notna()]
    xs, ys = [float(x) for x in sub["tokens_per_s"]], [float(y) for y in sub[m]]
    variants = [look["variant"][i] for i in sub.index]
    bars = [sub.get(c, pd.Series(math.nan, index=sub.index)).astype(float).tolist() for c in SPEED_CI]
    line = [float(ref[m].iloc[0])] if not ref.empty and not pd.isna(ref[m].iloc[0]) else []
    places = place_labels(list(zip(xs, ys, variants, *bars)), panel["x"], panel["y"], panel["size"], line)
    direct = dict(zip(sub.index, places))
    traces = []
    for label, group in sub.groupby(pd.Series(variants, index=sub.index), sort=False):
        traces.append(
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": inert(label),
                "legendgroup": label,
                "legend": look["legend"][label][0],
                "legendrank": look["legend"][label][1],
                "showlegend": k == 0,
                "x": [float(x) for x in group["tokens_per_s"]],
                "y": [float(y) for y in group[m]],
                "text": [inert(direct[i][0]) for i in group.index],  # beside the point where it fits
                "textposition": [direct[i][1] for i in group.index],
                "textfont": {"size": LABEL_FONT, "color": look["marker"][label]["color"]},
                "customdata": [inert(look["cell"][i]) for i in group.index],
                "marker": look["marker"][label],
                "error_x": _speed_bars(group),  # tokens/s: its 95% interval over batches
                "hovertemplate": "%{customdata}<br>tokens/s %{x:.3g}<br>" + m + " %{y:.4g}<extra></extra>",
                **axes,
            }
        )
    return traces + _lines(xs, ys, ref, m, k, look["legend"], axes)


def _lines(xs: list[float], ys: list[float], ref: pd.DataFrame, m: str, k: int, legend: dict, axes: dict) -> list[dict]:
    """A panel's Pareto front (dotted) and the reference's value (dashed)."""
    traces = []
    front = pareto_front(xs, ys, y_higher_is_better=bool(_direction(m)))
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "Pareto front",
            "legendgroup": "front",
            "legend": legend["Pareto front"][0],
            "showlegend": k == 0,
            "x": [xs[i] for i in front],
            "y": [ys[i] for i in front],
            "hoverinfo": "skip",
            "line": {"dash": "dot", "color": "#444"},
            **axes,
        }
    )
    if xs and not ref.empty and not pd.isna(ref[m].iloc[0]):
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "reference",
                "legendgroup": "reference",
                "legend": legend["reference"][0],
                "showlegend": k == 0,
                "x": [min(xs), max(xs)],
                "y": [float(ref[m].iloc[0])] * 2,
                "line": {"dash": "dash", "color": "#8d6e63"},
                **axes,
            }
        )
    return traces


def _panels_layout(models: list, x_range: list[float], m: str, y_range: list[float]) -> dict:
    columns = min(len(models), PANEL_COLUMNS)
    rows = -(-len(models) // columns)
    layout: dict[str, Any] = {
        "grid": {"rows": rows, "columns": columns, "pattern": "independent", "xgap": GAPS[0], "ygap": GAPS[1]}
    }
    annotations = []
    for k, model in enumerate(models):
        suffix = str(k + 1) if k else ""
        layout[f"xaxis{suffix}"] = {"range": x_range, "title": {"text": "tokens/s (higher is better)"}}
        layout[f"yaxis{suffix}"] = {"range": y_range, "title": {"text": axis_title(m)}}
        if len(models) > 1:
            annotations.append(
                {
                    "text": f"<b>{inert(model)}</b>",
                    "showarrow": False,
                    "x": 0.5,
                    "y": 1.0,
                    "yanchor": "bottom",
                    "xref": f"x{suffix} domain",
                    "yref": f"y{suffix} domain",
                }
            )
    layout["annotations"] = annotations
    return layout


def _axes(m: str, y_range: list[float], n: int) -> dict:
    """The y axes' title and range for metric `m`, as the metric menu sets them (`yaxis2.title.text`, …)."""
    out = {}
    for k in range(n):
        out[f"yaxis{k + 1 if k else ''}.title.text"] = axis_title(m)
        out[f"yaxis{k + 1 if k else ''}.range"] = y_range
    return out


def _look(summary: pd.DataFrame, cells: pd.DataFrame, ref: pd.DataFrame, plot_w: float) -> tuple[dict, dict, float]:
    """(how the cells look: their variant and cell labels, markers and legends; the legends' layout entries;
    their block's height in px)."""
    variant = dict(zip(summary.index, variant_labels(summary)))
    labels = [variant[i] for i in cells.index]
    families: dict[str, list[str]] = {}
    for strategy, label in dict.fromkeys(zip(cells["strategy"], labels)):
        families.setdefault(strategy, []).append(label)
    extra = ["Pareto front"] + (["reference"] if not ref.empty else [])
    legend_layout, owner, block = legends({inert(s): [inert(x) for x in v] for s, v in families.items()}, plot_w, extra)
    look = {
        "variant": variant,
        "cell": dict(zip(summary.index, cell_labels(summary, with_model=True))),
        "marker": encoding(list(cells["strategy"]), labels),
        "legend": {**{label: owner[inert(label)] for label in labels}, **{x: owner[x] for x in extra}},
    }
    return look, legend_layout, block


def quality_speed_figure(summary: pd.DataFrame) -> dict | None:
    """Plotly figure (a dict): the cells at (tokens/s, metric), a menu of metrics, the Pareto front."""
    keep = (summary["strategy"] != REFERENCE) & summary["tokens_per_s"].notna()
    cells, ref = summary[keep], summary[summary["strategy"] == REFERENCE]
    choices = [m for m in metric_columns(summary) if _direction(m) is not None and cells[m].notna().any()]
    preferred = [m for m in ("exact_match", "diversity", "perplexity", "self_bleu_4", "bleu") if m in choices]
    choices = preferred + [m for m in choices if m not in preferred]
    if cells.empty or not choices:
        return None
    models = list(dict.fromkeys(cells["model"]))
    columns, rows = min(len(models), PANEL_COLUMNS), -(-len(models) // PANEL_COLUMNS)
    plot_w = NOMINAL_WIDTH - MARGIN["l"] - MARGIN["r"]
    look, legend_layout, block = _look(summary, cells, ref, plot_w)
    xs_all = [float(x) for x in cells["tokens_per_s"]]
    pad = (max(xs_all) - min(xs_all)) * 0.15 or max(xs_all) * 0.15 or 1.0
    x_range = [min(xs_all) - pad, max(xs_all) + pad]
    # the panels as tall as a printed page leaves them beside the legends (never below MIN_PANEL_HEIGHT)
    room = PAGE_HEIGHT - MARGIN["t"] - BELOW_AXIS_PX - block
    plot_h = max(MIN_PANEL_HEIGHT * rows, min(PANEL_HEIGHT * rows, room))
    size = (plot_w / (columns + (columns - 1) * GAPS[0]), plot_h / (rows + (rows - 1) * GAPS[1]))
    traces: list[dict] = []
    spans = []
    for n, m in enumerate(choices):
        start = len(traces)
        panel = {"x": x_range, "y": _y_range(cells, ref, m), "size": size}
        for k, model in enumerate(models):
            traces += _panel_traces(cells[cells["model"] == model], ref, m, k, look, panel)
        for t in traces[start:]:
            t["visible"] = n == 0
        spans.append((start, len(traces) - start, _axes(m, panel["y"], len(models))))
    buttons = [
        {"label": m, "method": "update", "args": [{"visible": [s <= i < s + c for i in range(len(traces))]}, axes]}
        for m, (s, c, axes) in zip(choices, spans)
    ]
    layout = _panels_layout(models, x_range, choices[0], _y_range(cells, ref, choices[0]))
    place_legends(legend_layout, plot_w, plot_h, BELOW_AXIS_PX)
    layout.update(legend_layout)
    layout.update(
        margin={**MARGIN, "b": BELOW_AXIS_PX + block},
        height=MARGIN["t"] + plot_h + BELOW_AXIS_PX + block,
        title={"text": "Quality vs speed (the Pareto front is dotted)", "x": 0.5},
        updatemenus=[
            {
                "buttons": buttons,
                "x": 0,
                "y": 1.0,
                "yanchor": "bottom",
                "xanchor": "left",
                "direction": "down",
                "pad": {"b": 30},
            }
        ],
    )
    return {"data": traces, "layout": layout}


def metric_figure(summary: pd.DataFrame, m: str) -> dict | None:
    """Plotly figure (a dict): one horizontal bar per cell, the interval as error bars."""
    rows = summary[summary[m].notna()]
    if rows.empty:
        return None
    label = dict(zip(summary.index, cell_labels(summary)))
    labels, values = [label[i] for i in rows.index], [float(v) for v in rows[m]]
    bar: dict[str, Any] = {
        "type": "bar",
        "orientation": "h",
        "y": [inert(label) for label in labels],
        "x": values,
        "hovertemplate": "%{y}<br>%{x:.4g}<extra></extra>",
        "marker": {"color": ["#bcaaa4" if x == REFERENCE else "#1f77b4" for x in labels]},
    }
    if f"{m}_ci_low" in rows.columns and rows[f"{m}_ci_low"].notna().any():
        lo = [_f(v) for v in rows[f"{m}_ci_low"]]
        hi = [_f(v) for v in rows[f"{m}_ci_high"]]
        bar["error_x"] = {
            "type": "data",
            "symmetric": False,
            "array": [h - v if not math.isnan(h) else 0 for h, v in zip(hi, values)],
            "arrayminus": [v - lw if not math.isnan(lw) else 0 for lw, v in zip(lo, values)],
        }
    row = 22 if len(labels) <= 24 else max(13, 560 // len(labels))  # a chart stays within a printed page
    layout = {
        "height": 90 + row * len(labels),
        "title": {"text": axis_title(m), "font": {"size": 14}},
        "margin": {"t": 40, "l": 10, "r": 10, "b": 30},
        "yaxis": {"automargin": True, "autorange": "reversed", "tickfont": {"size": min(11, row - 3)}},
        "bargap": 0.25,
    }
    return {"data": [bar], "layout": layout}
