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
from controller.report.render.labels import cell_label, variant_label, varying_params

SPEED = {
    "tokens_per_s": True,
    "latency_ms_p50": False,
    "latency_ms_p95": False,
    "ttft_ms_p50": False,
    "peak_memory_mb": False,
}
SPEED_CI = ["tokens_per_s_ci_low", "tokens_per_s_ci_high"]
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
SYMBOLS = [
    "circle",
    "square",
    "diamond",
    "triangle-up",
    "cross",
    "x",
    "star",
    "pentagon",
    "hexagon",
    "triangle-down",
    "hourglass",
    "bowtie",
    "triangle-left",
    "triangle-right",
    "hexagram",
    "star-square",
    "diamond-wide",
    "square-x",
    "circle-x",
    "star-diamond",
]
MARKS = [(s + fill, c) for fill in ("", "-open") for s in SYMBOLS for c in PALETTE]  # 400 distinct marks
PANEL_COLUMNS = 3
PANEL_HEIGHT = 420


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


def encoding(cells: pd.DataFrame, varying: dict) -> dict[str, dict]:
    """variant label -> its marker, in sweep order: the symbol names the strategy and the colour the variant
    (the sweep's first ten variants ten colours), and no two variants share both (a strategy's eleventh
    variant takes its symbol open, then the next free symbol), so that a still picture (a printout, a
    screenshot) tells every variant apart; past MARKS' 400 marks they repeat, one per 400 variants."""
    strategies = list(dict.fromkeys(cells["strategy"]))
    variants = list(dict.fromkeys((r["strategy"], variant_label(r, varying)) for _, r in cells.iterrows()))
    used: set[tuple[str, str]] = set()
    out = {}
    for i, (strategy, label) in enumerate(variants):
        home = strategies.index(strategy) % len(SYMBOLS)
        order = [
            (SYMBOLS[(home + k) % len(SYMBOLS)] + fill, PALETTE[(i + j) % len(PALETTE)])
            for k in range(len(SYMBOLS))
            for fill in ("", "-open")
            for j in range(len(PALETTE))
        ]
        symbol, color = next((m for m in order if m not in used), MARKS[i % len(MARKS)])
        used.add((symbol, color))
        out[label] = {"symbol": symbol, "color": color, "size": 11, "line": {"width": 1.5, "color": color}}
    return out


def _panel_traces(cells: pd.DataFrame, ref: pd.DataFrame, m: str, k: int, varying: dict, markers: dict) -> list[dict]:
    """One model's panel (axes x{k}, y{k}): a trace per variant, the Pareto front, the reference."""
    axes = {"xaxis": f"x{k + 1 if k else ''}", "yaxis": f"y{k + 1 if k else ''}"}
    sub = cells[cells[m].notna()]
    traces = []
    for label, group in sub.groupby(sub.apply(lambda r: variant_label(r, varying), axis=1), sort=False):
        hover = [inert(cell_label(r, varying)) for _, r in group.iterrows()]
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": inert(label),
                "legendgroup": label,
                "showlegend": k == 0,
                "x": [float(x) for x in group["tokens_per_s"]],
                "y": [float(y) for y in group[m]],
                "text": hover,
                "marker": markers[label],
                "error_x": _speed_bars(group),  # tokens/s: its 95% interval over batches
                "hovertemplate": "%{text}<br>tokens/s %{x:.3g}<br>" + m + " %{y:.4g}<extra></extra>",
                **axes,
            }
        )
    xs, ys = [float(x) for x in sub["tokens_per_s"]], [float(y) for y in sub[m]]
    front = pareto_front(xs, ys, y_higher_is_better=bool(_direction(m)))
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "Pareto front",
            "legendgroup": "front",
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
                "showlegend": k == 0,
                "x": [min(xs), max(xs)],
                "y": [float(ref[m].iloc[0])] * 2,
                "line": {"dash": "dash", "color": "#8d6e63"},
                **axes,
            }
        )
    return traces


def _panels_layout(models: list, x_range: list[float], m: str) -> dict:
    columns = min(len(models), PANEL_COLUMNS)
    rows = -(-len(models) // columns)
    layout: dict[str, Any] = {"grid": {"rows": rows, "columns": columns, "pattern": "independent"}}
    annotations = []
    for k, model in enumerate(models):
        suffix = str(k + 1) if k else ""
        layout[f"xaxis{suffix}"] = {"range": x_range, "title": {"text": "tokens/s (higher is better)"}}
        layout[f"yaxis{suffix}"] = {"title": {"text": axis_title(m)}}
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
    layout["height"] = PANEL_HEIGHT * rows + 80
    return layout


def quality_speed_figure(summary: pd.DataFrame) -> dict | None:
    """Plotly figure (a dict): the cells at (tokens/s, metric), a menu of metrics, the Pareto front."""
    cells = summary[(summary["strategy"] != REFERENCE) & summary["tokens_per_s"].notna()]
    ref = summary[summary["strategy"] == REFERENCE]
    choices = [m for m in metric_columns(summary) if _direction(m) is not None and cells[m].notna().any()]
    preferred = [m for m in ("exact_match", "diversity", "perplexity", "self_bleu_4", "bleu") if m in choices]
    choices = preferred + [m for m in choices if m not in preferred]
    if cells.empty or not choices:
        return None
    varying = varying_params(summary)
    markers = encoding(cells, varying)
    models = list(dict.fromkeys(cells["model"]))
    traces: list[dict] = []
    spans = []
    for n, m in enumerate(choices):
        start = len(traces)
        for k, model in enumerate(models):
            traces += _panel_traces(cells[cells["model"] == model], ref, m, k, varying, markers)
        for t in traces[start:]:
            t["visible"] = n == 0
        spans.append((start, len(traces) - start))
    titles = lambda m: {f"yaxis{k + 1 if k else ''}.title.text": axis_title(m) for k in range(len(models))}
    buttons = [
        {"label": m, "method": "update", "args": [{"visible": [s <= i < s + c for i in range(len(traces))]}, titles(m)]}
        for m, (s, c) in zip(choices, spans)
    ]
    xs_all = [float(x) for x in cells["tokens_per_s"]]
    pad = (max(xs_all) - min(xs_all)) * 0.15 or max(xs_all) * 0.15 or 1.0
    layout = _panels_layout(models, [min(xs_all) - pad, max(xs_all) + pad], choices[0])
    layout.update(
        margin={"t": 70, "l": 60, "r": 20, "b": 50},
        title={"text": "Quality vs speed (the Pareto front is dotted)", "x": 0.5},
        legend={"orientation": "h", "y": -0.12, "yanchor": "top", "itemclick": "toggle"},
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
    layout["height"] += 24 * -(-len(markers) // 5)  # the legend's rows below the panels
    return {"data": traces, "layout": layout}


def metric_figure(summary: pd.DataFrame, m: str) -> dict | None:
    """Plotly figure (a dict): one horizontal bar per cell, the interval as error bars."""
    rows = summary[summary[m].notna()]
    if rows.empty:
        return None
    multi = summary["model"].dropna().nunique() > 1
    varying = varying_params(summary)
    labels, values = [cell_label(r, varying, multi) for _, r in rows.iterrows()], [float(v) for v in rows[m]]
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
