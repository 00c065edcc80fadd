"""One label per strategy variant in every view (issue 42, "cell labels differ between chart and table"):
the HTML table (on screen and printed), the quality-vs-speed traces, the bar charts, the example cards,
summary.md, the terminal table and `status --watch` name a sweep's variants alike; a parameter shows where
it tells the strategy's variants apart, and two different variants never share a label."""

from __future__ import annotations

import html
import io
import json
import re

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from controller.cli.distributed import render_status
from controller.cli.table import print_summary
from controller.report.compute.aggregate import summarize
from controller.report.render.format import markdown_table
from controller.report.render.html import render_html
from controller.report.render.plots import metric_figure, quality_speed_figure
from tests.support.report import make_sweep

pytestmark = pytest.mark.pure

VARIANTS = (
    [("greedy", {}), ("greedy", {"repetition_penalty": 1.3}), ("beam", {"num_beams": 4})]
    + [("top_k", {"k": 40, "temperature": 1.0})]  # one variant: every parameter the same, none shown
    + [("top_p", {"p": p, "temperature": 1.0}) for p in (0.8, 0.9, 0.95)]
    + [("min_p", {"min_p": m, "temperature": t}) for m, t in ((0.05, 0.7), (0.1, 0.7), (0.1, 1.0))]
)
EXPECTED = {
    "greedy",
    "greedy(repetition_penalty=1.3)",
    "beam",
    "top_k",
    "top_p(p=0.8)",
    "top_p(p=0.9)",
    "top_p(p=0.95)",
    "min_p(min_p=0.05,temperature=0.7)",
    "min_p(min_p=0.1,temperature=0.7)",
    "min_p(min_p=0.1,temperature=1.0)",
}


@pytest.fixture(scope="module")
def sweep():
    cells = [(m, s, p) for m in ("austen-tiny", "austen-small") for s, p in VARIANTS]
    data = make_sweep(n_prompts=3, shard_size=3, cells=cells)
    return data, summarize(data, n_boot=0)


def _column(lines: list[str], header: str) -> list[str]:
    """A Markdown table's column, by its header."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    at = rows[0].index(header)
    return [html.unescape(r[at]) for r in rows[2:]]


def test_every_view_names_the_variants_as_the_chart_does(sweep):
    data, summary = sweep
    fig = quality_speed_figure(summary)
    traces = {html.unescape(t["name"]) for t in fig["data"] if t["mode"].startswith("markers")}
    page = render_html(summary, data)
    screen, printed = page.split('<div class="print-only">', 1)
    table = screen.split('id="summary-table"')[1].split("</table>")[0]
    shown = {html.unescape(v) for v in re.findall(r'<td class="t k" data-v="([^"]*)"[^>]*>', table)}
    assert shown - {"austen-tiny", "austen-small", ""} == traces | {"reference"}  # the HTML table's cells
    printed_rows = {html.unescape(x) for x in re.findall(r'<tr><td class="t">([^<]*)</td>', printed)}
    cards = {html.unescape(x) for x in re.findall(r'<div class="card"><h4>([^<]*)</h4>', page)}
    bars = {html.unescape(y) for y in metric_figure(summary, "diversity")["data"][0]["y"]}
    for model in ("austen-tiny", "austen-small"):
        assert {x.split(" · ", 1)[1] for x in printed_rows if x.startswith(model + " · ")} == traces
        assert {x.split(" · ", 1)[1] for x in bars if x.startswith(model + " · ")} == traces
    assert cards == traces
    md = markdown_table(summary).splitlines()
    assert set(_column(md, "strategy")) == traces | {"reference"}  # summary.md and the piped table
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=250, highlight=False, color_system=None))
    terminal = out.getvalue().splitlines()
    at = terminal[0].index("strategy")
    assert {line[at:].split("  ")[0] for line in terminal[1:] if line.strip()} == traces | {"reference"}
    assert traces == EXPECTED  # the parameters that tell a strategy's variants apart, and no other


def test_status_watch_names_the_cells_as_the_report_does(sweep):
    _, summary = sweep
    cells = {c: {"done": 1} for c in summary.loc[summary["strategy"] != "reference", "cell"]}
    s = {"sweep_id": "s", "name": "n", "tenant": "t", "queue": "q", "cancelled": False, "jobs": len(cells),
         "complete": True, "cells": cells, "totals": {"queued": 0, "running": 0, "done": len(cells), "failed": 0,
         "cancelled": 0}, "jobs_per_s": 1.0, "tokens_per_s": 10.0, "eta_s": 0, "lost": 0, "stale": 0,
         "n_failures": 0, "failures": []}  # fmt: skip
    rows = render_status(s).splitlines()[4:]
    labels = {re.split(r"\s{2,}", row.strip())[0] for row in rows}
    assert labels == {f"{m} · {v}" for m in ("austen-tiny", "austen-small") for v in EXPECTED}


def test_two_engines_label_the_engine_in_the_report_and_in_status():
    cells = [("austen-tiny", s, p) for s, p in VARIANTS[:4]]
    data = make_sweep(n_prompts=3, shard_size=3, cells=cells, engines=("decodebench", "vllm"))
    summary = summarize(data, n_boot=0)
    traces = {
        html.unescape(t["name"]) for t in quality_speed_figure(summary)["data"] if t["mode"].startswith("markers")
    }
    assert traces == {f"{v} @ {e}" for v in ("greedy", "greedy(repetition_penalty=1.3)", "beam", "top_k")
                      for e in ("decodebench", "vllm")}  # fmt: skip
    from controller.sweep.labels import key_labels

    assert set(key_labels(list(summary.loc[summary["strategy"] != "reference", "cell"]))) == traces


params = st.dictionaries(st.sampled_from("abc"), st.sampled_from([0.1, 0.2, 1, "x", True]), max_size=3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["top_p", "top_k"]), params), min_size=1, max_size=12, unique_by=str))
def test_two_different_variants_never_share_a_label(variants):
    summary = pd.DataFrame(
        [{"model": "m", "strategy": s, "params": json.dumps(p, sort_keys=True)} for s, p in variants]
    ).drop_duplicates(["strategy", "params"])
    from controller.report.render.labels import variant_labels

    labels = variant_labels(summary)
    assert len(set(labels)) == len(summary)
