"""report.html: one self-contained page that opens offline.

plotly.js is inlined (no CDN); every text from the sweep is escaped with html.escape
and every chart's JSON with plotly's own escaping (no `</script>` can close a tag).
Sections: summary table (sortable by clicking a header, or with `#sort=COLUMN` /
`#sort=-COLUMN` in the address), quality vs speed with the Pareto front, one bar chart
per metric with its interval, example generations side by side with repeated n-grams
marked, the metrics' meaning, and the sweep's spec and provenance. Its CSS and
JavaScript are package files in controller/report/assets/, inlined as they are.
"""

from __future__ import annotations

import html
import json
import math
import re
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pandas as pd
import plotly.io as pio
from plotly.io.json import to_json_plotly
from plotly.offline import get_plotlyjs

from controller.metrics import METRICS
from controller.metrics.tokenize import WORD_PATTERN
from controller.report.aggregate import DESIGN_COLUMNS, REFERENCE, SweepData, metric_columns
from controller.report.format import fmt, model_based_metrics, params_label, row_label
from controller.report.html_tables import metrics_glossary, provenance
from controller.report.paired import comparison_html, comparison_table, is_comparison_column
from controller.report.speed import unresolved_note, unresolved_speed
from worker.strategies import STRATEGIES

EXAMPLE_PROMPTS = 3
MARK_N = 3  # a word n-gram of this size seen earlier in the same text is marked
SPEED = {"tokens_per_s": True, "latency_ms_p50": False, "latency_ms_p95": False, "ttft_ms_p50": False,
         "peak_memory_mb": False}  # fmt: skip
_WORD = re.compile(WORD_PATTERN)
SPEED_CI = ["tokens_per_s_ci_low", "tokens_per_s_ci_high"]
e = html.escape

ASSETS = "assets"  # report.css, error_trap.js, report.js: package data of controller.report


@cache
def asset(name: str) -> str:
    """The text of a file in controller/report/assets/, inlined into every page."""
    return resources.files("controller.report").joinpath(ASSETS).joinpath(name).read_text(encoding="utf-8")


def _f(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _label(row: pd.Series, with_model: bool = True) -> str:
    """`model · strategy(non-default params)`, e.g. `austen-tiny · top_p(p=0.9)`."""
    if row["strategy"] == REFERENCE:
        return REFERENCE
    try:
        params = json.loads(row["params"] or "{}")
    except (TypeError, ValueError):
        params = {}
    spec = STRATEGIES.get(row["strategy"]) if row["strategy"] in STRATEGIES else None
    shown = {
        k: v for k, v in params.items() if spec is None or k not in spec.all_params or spec.all_params[k].default != v
    }
    variant = row["strategy"] + (f"({','.join(f'{k}={v}' for k, v in shown.items())})" if shown else "")
    engine = row.get("engine")  # present only where a sweep runs several engines (docs/engines.md)
    if isinstance(engine, str) and engine:
        variant = f"{variant} @ {engine}"
    return f"{row['model']} · {variant}" if with_model else variant


def summary_table(summary: pd.DataFrame) -> str:
    cols = [c for c in summary.columns if "_ci_" not in c and c != "cell" and not is_comparison_column(c)]
    head = "".join(
        f'<th data-col="{e(c)}" class="{"t" if c in ("model", "strategy", "params", "memory_kind", "engine") else ""}">'
        f"{e(c)}</th>"
        for c in cols
    )
    body = []
    for _, row in summary.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            missing = v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))
            sort_value = "" if missing else str(v)
            text = "" if missing else (str(v) if isinstance(v, str) else fmt(v))
            title = ""
            lo, hi = row.get(f"{c}_ci_low"), row.get(f"{c}_ci_high")
            if not missing and lo is not None and not pd.isna(lo):
                title = f' title="95% CI [{e(fmt(lo))}, {e(fmt(hi))}]"'
            klass = ' class="t"' if isinstance(v, str) or c in ("model", "strategy", "params") else ""
            cells.append(f'<td{klass} data-v="{e(sort_value)}"{title}>{e(text)}</td>')
        klass = ' class="reference"' if row["strategy"] == REFERENCE else ""
        body.append(f"<tr{klass}>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table id="summary-table" class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


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


def speed_note(summary: pd.DataFrame) -> str:
    """The sentence naming neighbouring cells whose tokens/s intervals overlap (empty if none)."""
    if not set(SPEED_CI) <= set(summary.columns):
        return ""
    rows = [(_label(r), _f(r["tokens_per_s"]), _f(r[SPEED_CI[0]]), _f(r[SPEED_CI[1]])) for _, r in summary.iterrows()]
    return unresolved_note(unresolved_speed(rows))


def _direction(name: str) -> bool | None:
    return METRICS.get(name).higher_is_better if name in METRICS else None


def _metric_traces(cells: pd.DataFrame, ref: pd.DataFrame, m: str) -> list[dict]:
    """The scatter of the cells on (tokens/s, m), their Pareto front and the reference line."""
    sub = cells[cells[m].notna()]
    xs, ys = [float(x) for x in sub["tokens_per_s"]], [float(y) for y in sub[m]]
    labels = [_label(r, cells["model"].nunique() > 1) for _, r in sub.iterrows()]
    front = pareto_front(xs, ys, y_higher_is_better=bool(_direction(m)))
    mine = [
        {
            "type": "scatter",
            "x": xs,
            "y": ys,
            "mode": "markers+text",
            "text": labels,
            "name": "cells",
            "textposition": "top center",
            "marker": {"size": 10, "color": "#1f77b4"},
            "hovertemplate": "%{text}<br>tokens/s %{x:.3g}<br>" + m + " %{y:.4g}<extra></extra>",
            "error_x": _speed_bars(sub),  # tokens/s: its 95% interval over batches
        },
        {
            "type": "scatter",
            "x": [xs[i] for i in front],
            "y": [ys[i] for i in front],
            "mode": "lines+markers",
            "name": "Pareto front",
            "hoverinfo": "skip",
            "line": {"dash": "dot", "color": "#d62728"},
            "marker": {"size": 16, "symbol": "circle-open", "color": "#d62728"},
        },
    ]
    if not ref.empty and not pd.isna(ref[m].iloc[0]):
        mine.append(
            {
                "type": "scatter",
                "x": [min(xs), max(xs)],
                "y": [float(ref[m].iloc[0])] * 2,
                "mode": "lines",
                "name": "reference",
                "line": {"dash": "dash", "color": "#8d6e63"},
            }
        )
    return mine


def _speed_bars(sub: pd.DataFrame) -> dict:
    lo, hi, x = (sub.get(c, pd.Series(math.nan, index=sub.index)).astype(float) for c in SPEED_CI + ["tokens_per_s"])
    return {
        "type": "data",
        "symmetric": False,
        "array": (hi - x).fillna(0).tolist(),
        "arrayminus": (x - lo).fillna(0).tolist(),
    }


def quality_speed_figure(summary: pd.DataFrame) -> dict | None:
    """Plotly figure (a dict): the cells at (tokens/s, metric), a menu of metrics, the Pareto front."""
    cells = summary[(summary["strategy"] != REFERENCE) & summary["tokens_per_s"].notna()]
    ref = summary[summary["strategy"] == REFERENCE]
    choices = [m for m in metric_columns(summary) if _direction(m) is not None and cells[m].notna().any()]
    preferred = [m for m in ("diversity", "perplexity", "self_bleu_4", "bleu") if m in choices]
    choices = preferred + [m for m in choices if m not in preferred]
    if cells.empty or not choices:
        return None
    traces: list[dict] = []
    buttons, spans = [], []
    for k, m in enumerate(choices):
        mine = _metric_traces(cells, ref, m)
        for t in mine:
            t["visible"] = k == 0
        spans.append((len(traces), len(mine)))
        traces += mine
    for m, (start, count) in zip(choices, spans):
        visible = [start <= i < start + count for i in range(len(traces))]
        buttons.append(
            {"label": m, "method": "update", "args": [{"visible": visible}, {"yaxis.title.text": _axis_title(m)}]}
        )
    xs_all = [float(x) for x in cells["tokens_per_s"]]
    pad = (max(xs_all) - min(xs_all)) * 0.15 or max(xs_all) * 0.15 or 1.0
    layout = {
        "height": 460,
        "margin": {"t": 60, "l": 60, "r": 20, "b": 50},
        "title": {"text": "Quality vs speed (the Pareto front is dotted)", "x": 0.3},
        "xaxis": {"title": {"text": "tokens/s (higher is better)"}, "range": [min(xs_all) - pad, max(xs_all) + pad]},
        "yaxis": {"title": {"text": _axis_title(choices[0])}},
        "updatemenus": [{"buttons": buttons, "x": 0, "y": 1.15, "xanchor": "left", "direction": "down"}],
    }
    return {"data": traces, "layout": layout}


def _axis_title(m: str) -> str:
    direction = SPEED.get(m, _direction(m))
    return m + ("" if direction is None else " (higher is better)" if direction else " (lower is better)")


def metric_figure(summary: pd.DataFrame, m: str) -> dict | None:
    """Plotly figure (a dict): one bar per cell, the interval as error bars."""
    rows = summary[summary[m].notna()]
    if rows.empty:
        return None
    multi = summary["model"].dropna().nunique() > 1
    labels, values = [_label(r, multi) for _, r in rows.iterrows()], [float(v) for v in rows[m]]
    bar: dict[str, Any] = {
        "type": "bar",
        "x": labels,
        "y": values,
        "hovertemplate": "%{x}<br>%{y:.4g}<extra></extra>",
        "marker": {"color": ["#bcaaa4" if x == REFERENCE else "#1f77b4" for x in labels]},
    }
    if f"{m}_ci_low" in rows.columns and rows[f"{m}_ci_low"].notna().any():
        lo = [_f(v) for v in rows[f"{m}_ci_low"]]
        hi = [_f(v) for v in rows[f"{m}_ci_high"]]
        bar["error_y"] = {
            "type": "data",
            "symmetric": False,
            "array": [h - v if not math.isnan(h) else 0 for h, v in zip(hi, values)],
            "arrayminus": [v - lw if not math.isnan(lw) else 0 for lw, v in zip(lo, values)],
        }
    layout = {
        "height": 320,
        "title": {"text": _axis_title(m), "font": {"size": 14}},
        "margin": {"t": 40, "l": 50, "r": 10, "b": 90},
        "xaxis": {"tickangle": -25, "automargin": True},
    }
    return {"data": [bar], "layout": layout}


def mark_repeats(text: str, n: int = MARK_N) -> str:
    """Escaped text with every word n-gram that repeats an earlier one in <mark>."""
    tokens = [(m.start(), m.end(), m.group().lower()) for m in _WORD.finditer(text)]
    seen: set[tuple[str, ...]] = set()
    spans: list[list[int]] = []
    for i in range(len(tokens) - n + 1):
        gram = tuple(t[2] for t in tokens[i : i + n])
        if gram in seen:
            start, end = tokens[i][0], tokens[i + n - 1][1]
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([start, end])
        seen.add(gram)
    out, pos = [], 0
    for start, end in spans:
        out += [e(text[pos:start]), "<mark>", e(text[start:end]), "</mark>"]
        pos = end
    out.append(e(text[pos:]))
    return "".join(out)


def examples(summary: pd.DataFrame, data: SweepData) -> str:
    by_key: dict[tuple[str, str], Any] = {k: SimpleNamespace(**v) for k, v in data.examples.items()}
    for g in sorted(data.generations, key=lambda g: g.job_seed, reverse=True) if not by_key else ():
        by_key[(g.cell, g.prompt_id)] = g  # the lowest seed wins
    cells = [r for _, r in summary.iterrows() if r["strategy"] != REFERENCE]
    models = list(dict.fromkeys(r["model"] for r in cells))
    parts = []
    for model in models:
        model_cells = [r for r in cells if r["model"] == model]
        prompts = [p for p in data.prompts if any((r["cell"], p.id) in by_key for r in model_cells)][:EXAMPLE_PROMPTS]
        parts.append(f"<h3>{e(str(model))}</h3>")
        for p in prompts:
            cards = []
            for r in model_cells:
                g = by_key.get((r["cell"], p.id))
                if g is None:
                    continue
                cards.append(
                    f'<div class="card"><h4>{e(_label(r, False))}</h4><p>{mark_repeats(g.text)}</p>'
                    f'<div class="small">seed {g.job_seed} · {g.n_new_tokens} tokens · stopped: '
                    f"{e(g.stop_reason)}</div></div>"
                )
            if p.reference:
                cards.append(f'<div class="card ref"><h4>reference</h4><p>{mark_repeats(p.reference)}</p></div>')
            parts.append(
                f'<p><b>Prompt {e(p.id)}:</b> <code>{e(p.prompt)}</code></p><div class="cards">{"".join(cards)}</div>'
            )
    return "".join(parts) or "<p>No generations.</p>"


def render_html(summary: pd.DataFrame, data: SweepData) -> str:
    """The whole page as one string."""
    from controller.report.ratings import rating_table, ratings_html

    charts: list[tuple[str, dict]] = []
    scatter = quality_speed_figure(summary)
    if scatter is not None:
        charts.append(("chart-quality-speed", scatter))
    bars = [c for c in list(SPEED) + metric_columns(summary) if c in summary.columns]
    for m in bars:
        fig = metric_figure(summary, m)
        if fig is not None:
            charts.append((f"chart-{m}", fig))
    chart_js = to_json_plotly([{"id": i, "fig": f} for i, f in charts])
    template = to_json_plotly(pio.templates["plotly_white"].to_plotly_json())
    bar_divs = "".join(f'<div id="{e(i)}" class="chart"></div>' for i, _ in charts if i != "chart-quality-speed")
    ci = summary.attrs.get("ci")
    ci_text = (
        "Bars show 95% intervals over prompt resamples (see docs/reports.md)." if ci else "One seed: no intervals."
    )
    name = data.name
    done = f"{len(data.results)} complete job(s)" + (f" of {data.planned_jobs}" if data.planned_jobs else "")
    columns = ", ".join(DESIGN_COLUMNS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>decodebench: {e(str(name))} ({e(data.sweep_id)})</title><style>
{asset("report.css")}</style>
<script>
{asset("error_trap.js")}</script>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<pre id="js-errors"></pre>
<h1>decodebench report: {e(str(name))}</h1>
<div class="meta">sweep <code>{e(data.sweep_id)}</code> · tenant <code>{e(data.tenant)}</code> · {e(done)} ·
{data.n_generations} generations · written {e(datetime.now(UTC).isoformat(timespec="seconds"))}</div>
<nav><a href="#summary">Summary</a><a href="#quality-speed">Quality vs speed</a><a href="#metrics">Metrics</a>
<a href="#examples">Examples</a><a href="#glossary">Glossary</a><a href="#provenance">Spec and provenance</a></nav>
<h2 id="summary">Summary</h2>
<p class="small">Click a header to sort. Empty: the metric does not apply. Hover a value for its interval.
Columns: {e(columns)}; then extras.</p>
{summary_table(summary)}
{comparison_html(comparison_table(summary, fmt, row_label))}
{ratings_html(rating_table(summary, fmt, params_label))}<h2 id="quality-speed">Quality vs speed</h2>
<div id="chart-quality-speed" class="chart"></div><p class="small" id="speed-note">{e(speed_note(summary))}</p>
<h2 id="metrics">Metrics</h2><p class="small">{e(ci_text)} The reference row is brown.</p>
<div class="grid">{bar_divs}</div>
<h2 id="examples">Examples</h2>
<p class="small">The first seed's generation of each cell for the same prompt; <mark>marked</mark>: a word
{MARK_N}-gram repeating an earlier one of the same text.</p>
{examples(summary, data)}
<h2 id="glossary">Glossary</h2><p class="small">{e(model_based_metrics(data))}</p>{metrics_glossary(summary)}
<h2 id="provenance">Spec and provenance</h2>
<h3>Provenance of the complete jobs</h3>{provenance(data)}
<h3>Spec</h3><pre>{e(json.dumps(data.spec, indent=2, sort_keys=True, default=str))}</pre>
<script>window.__reportTemplate={template};window.__reportCharts={chart_js};</script>
<script>
{asset("report.js")}</script>
</body></html>
"""
