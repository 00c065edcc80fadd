"""report.html: one self-contained page that opens offline.

plotly.js is inlined (no CDN); every text from the sweep is escaped with html.escape
and every chart's JSON with plotly's own escaping (no `</script>` can close a tag).
Sections: summary table (sortable by clicking a header, or with `#sort=COLUMN` /
`#sort=-COLUMN` in the address), quality vs speed with the Pareto front, one bar chart
per metric with its interval, example generations side by side with repeated n-grams
marked, the metrics' meaning, and the sweep's spec and provenance. Its CSS and
JavaScript are package files in controller/report/render/assets/, inlined as they are.
"""

from __future__ import annotations

import html
import json
import math
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pandas as pd
import plotly.io as pio
from plotly.io.json import to_json_plotly
from plotly.offline import get_plotlyjs

from controller.metrics.tokenize import WORD_RE
from controller.report.compute.columns import DESIGN_COLUMNS, REFERENCE
from controller.report.load.jobs import MIN_CI_PROMPTS
from controller.report.load.sweep import SweepData
from controller.report.render.comparisons import comparison_html, comparison_table, floor_note
from controller.report.render.format import column_format, fmt, metric_columns, model_based_metrics, small_sample_note
from controller.report.render.html_tables import metrics_glossary, provenance
from controller.report.render.labels import cell_labels, labeller, variant_labels
from controller.report.render.plots import SPEED, SPEED_CI, metric_figure, pareto_front, quality_speed_figure  # noqa: F401
from controller.report.render.summary_table import summary_table
from controller.report.render.temperature import accuracy_temperature_figure
from controller.report.stats import speed

EXAMPLE_PROMPTS = 3
PRINT_SAMPLES_MAX_CELLS = 16  # above this many cells the printout leaves the examples out by default
MARK_N = 3  # a word n-gram of this size seen earlier in the same text is marked
_WORD = WORD_RE
e = html.escape

ASSETS = "assets"  # report.css, error_trap.js, report.js: package data of controller.report.render


@cache
def asset(name: str) -> str:
    """The text of a file in controller/report/render/assets/, inlined into every page."""
    return resources.files("controller.report.render").joinpath(ASSETS).joinpath(name).read_text(encoding="utf-8")


def _f(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def speed_note(summary: pd.DataFrame) -> str:
    """The sentences naming neighbouring cells whose tokens/s intervals overlap, and cells without one (empty if
    none)."""
    if not set(SPEED_CI) <= set(summary.columns):
        return ""
    rows = [
        (label, _f(r["tokens_per_s"]), _f(r[SPEED_CI[0]]), _f(r[SPEED_CI[1]]))
        for label, (_, r) in zip(cell_labels(summary, with_model=True), summary.iterrows())
    ]
    return speed.speed_note(rows)


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
    for g in sorted(data.generations, key=lambda g: (g.job_seed, g.sample), reverse=True) if not by_key else ():
        by_key[(g.cell, g.prompt_id)] = g  # the lowest seed's first sample wins, as the cells' examples
    cells = [r for _, r in summary.iterrows() if r["strategy"] != REFERENCE]
    variant = dict(zip(summary.index, variant_labels(summary)))
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
                    f'<div class="card"><h4>{e(variant[r.name])}</h4><p>{mark_repeats(g.text)}</p>'
                    f'<div class="small">seed {g.job_seed} · {g.n_new_tokens} tokens · stopped: '
                    f"{e(g.stop_reason)}</div></div>"
                )
            if p.reference:
                cards.append(f'<div class="card ref"><h4>reference</h4><p>{mark_repeats(p.reference)}</p></div>')
            parts.append(
                f'<p><b>Prompt {e(p.id)}:</b> <code>{e(p.prompt)}</code></p><div class="cards">{"".join(cards)}</div>'
            )
    return "".join(parts) or "<p>No generations.</p>"


def figures(summary: pd.DataFrame) -> list[tuple[str, dict]]:
    """(element id, plotly figure): quality vs speed, then a bar chart per speed and quality metric."""
    charts: list[tuple[str, dict]] = []
    scatter = quality_speed_figure(summary)
    if scatter is not None:
        charts.append(("chart-quality-speed", scatter))
    by_temperature = accuracy_temperature_figure(summary)
    if by_temperature is not None:
        charts.append(("chart-accuracy-temperature", by_temperature))
    for m in [c for c in list(SPEED) + metric_columns(summary) if c in summary.columns]:
        fig = metric_figure(summary, m)
        if fig is not None:
            charts.append((f"chart-{m}", fig))
    return charts


def print_samples_default(summary: pd.DataFrame) -> bool:
    """Whether the printout carries the examples unless the reader says otherwise: yes for a sweep of
    at most PRINT_SAMPLES_MAX_CELLS cells; above that their pages outnumber the table's and the plots'."""
    return int((summary["strategy"] != REFERENCE).sum()) <= PRINT_SAMPLES_MAX_CELLS


def samples_section(summary: pd.DataFrame, data: SweepData) -> str:
    """The examples with their print toggle: the checkbox sits in the navigation (screen only); a
    printout without them says so in one line where they would be."""
    body = examples(summary, data)
    n = body.count('<div class="card')
    return f"""<p class="small" id="samples-intro">The first seed's generation of each cell for the same prompt; \
<mark>marked</mark>: a word {MARK_N}-gram repeating an earlier one of the same text.</p>
<p class="samples-omitted">{n} example text{"" if n == 1 else "s"} left out of this printout: they are in report.html \
(untick "print without examples" to print them).</p>
<div id="samples">{body}</div>"""


def print_toggle(print_samples: bool) -> str:
    checked = "" if print_samples else " checked"
    return (
        '<label class="print-toggle" title="Printing or saving as PDF: leave out the example texts">'
        f'<input type="checkbox" id="print-no-samples"{checked}> print without examples</label>'
    )


def interval_note(ci: dict | None, no_ci: str | None = None) -> str:
    """The metrics section's line on intervals, with the small-sample caution where it applies (`no_ci`: why there
    are none, the summary's own words)."""
    text = (
        "Bars show 95% intervals over prompt resamples (see docs/reports.md)."
        if ci
        else no_ci or f"No intervals: a cell has fewer than {MIN_CI_PROMPTS} prompts."
    )
    note = small_sample_note(ci)
    return f"{text} {note}" if note else text


def render_html(summary: pd.DataFrame, data: SweepData, print_samples: bool | None = None) -> str:
    """The whole page as one string. `print_samples`: whether a printout carries the example texts
    (None: `print_samples_default`); on screen they are always there, and the page's checkbox
    changes the choice before printing."""
    if print_samples is None:
        print_samples = print_samples_default(summary)
    from controller.judge.report import judge_html
    from controller.report.render.ratings_table import rating_table, ratings_html

    charts = figures(summary)
    chart_js = to_json_plotly([{"id": i, "fig": f} for i, f in charts])
    template = to_json_plotly(pio.templates["plotly_white"].to_plotly_json())
    bar_divs = "".join(f'<div id="{e(i)}" class="chart"></div>' for i, _ in charts if i != "chart-quality-speed")
    ci_text = interval_note(summary.attrs.get("ci"), summary.attrs.get("no_ci"))
    name = data.name
    done = data.completeness()
    columns = ", ".join(DESIGN_COLUMNS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>decodebench: {e(str(name))} ({e(data.sweep_id)})</title><style>
{asset("report.css")}</style>
<script>
{asset("error_trap.js")}</script>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body{"" if print_samples else ' class="print-no-samples"'}>
<pre id="js-errors"></pre>
<h1>decodebench report: {e(str(name))}</h1>
<div class="meta">sweep <code>{e(data.sweep_id)}</code> · tenant <code>{e(data.tenant)}</code> · {e(done)} ·
{data.n_generations} generations · written {e(datetime.now(UTC).isoformat(timespec="seconds"))}</div>
{f'<p class="missing"><b>{e(data.missing_note())}</b></p>' if data.missing_cells else ""}
<nav><a href="#summary">Summary</a><a href="#quality-speed">Quality vs speed</a><a href="#metrics">Metrics</a>
<a href="#examples">Examples</a><a href="#glossary">Glossary</a><a href="#provenance">Spec and provenance</a>
{print_toggle(print_samples)}</nav>
<h2 id="summary">Summary</h2>
<p class="small"><span class="screen-only">Click a header to sort. Hover a value for its interval. </span>
Empty: the metric does not apply; a column empty for every cell is left out. Columns: {e(columns)}; then extras.</p>
{summary_table(summary)}
{comparison_html(comparison_table(summary, fmt, labeller(summary), column_format), floor_note(summary))}
{ratings_html(rating_table(summary, fmt, labeller(summary)))}
{judge_html(summary)}<h2 id="quality-speed">Quality vs speed</h2>
<p class="small screen-only">Hover a point for its cell; click a legend entry to hide its variant; the menu picks
the metric.</p>
<div id="chart-quality-speed" class="chart"></div><p class="small" id="speed-note">{e(speed_note(summary))}</p>
<h2 id="metrics">Metrics</h2><p class="small">{e(ci_text)} The reference row is brown.</p>
<div class="grid">{bar_divs}</div>
<h2 id="examples">Examples</h2>
{samples_section(summary, data)}
<h2 id="glossary">Glossary</h2><p class="small">{e(model_based_metrics(data))}</p>{metrics_glossary(summary)}
<h2 id="provenance">Spec and provenance</h2>
<h3>Provenance of the complete jobs</h3>{provenance(data)}
<h3>Spec</h3><pre id="spec">{e(json.dumps(data.spec, indent=2, sort_keys=True, default=str))}</pre>
<script>window.__reportTemplate={template};window.__reportCharts={chart_js};</script>
<script>
{asset("report.js")}</script>
</body></html>
"""
