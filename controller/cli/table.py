"""The summary as a terminal reads it: a rich table fitted to the terminal's width.

Columns come by importance (the cell, tokens/s, the sweep's quality metrics, then sample size, latency
and memory: `importance`); the least important go first when the terminal is narrow, and the table says
how many it left out.
A metric's column shares one number format (`format.ColumnFormat`, as in summary.md and the HTML
report: decimals chosen by the column's magnitude, so `rep_4` never mixes `0.00`, `2.58e-04` and
`0.786`), and an interval shows as `±h` where it is symmetric, else `+up/-down` from the value.
On a pipe or in a file, `run` and `report` print the Markdown table instead (scripts parse it)."""

from __future__ import annotations

import math

import click
import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from controller.report.compute.columns import QUALITY_COLUMNS, REFERENCE
from controller.report.render.format import CONCISE, SHORT, ColumnFormat, accuracy_columns, decimals, metric_columns
from controller.report.render.labels import variant_labels
from worker.core.safetext import terminal

KEEP = ["model", "strategy", "tokens_per_s"]  # never dropped
__all__ = ["decimals", "echo_summary", "fit", "print_summary", "summary_columns", "summary_table"]
COUNTS = {"n_generations"}
# The quality columns a narrow terminal keeps longest: diversity and perplexity tell strategies apart most.
RANK = ["diversity", "perplexity", "rep_4", "self_bleu_4", "bleu", "rouge_l", "mean_length"]


def _num(v) -> float:
    try:
        out = float(v)
    except (TypeError, ValueError):
        return math.nan
    return out


def _column(summary: pd.DataFrame, c: str, with_ci: bool, num: ColumnFormat) -> list[str]:
    d = num.decimals(c) or 0
    lo = summary.get(f"{c}_ci_low")
    hi = summary.get(f"{c}_ci_high")
    out = []
    for i, value in enumerate(summary[c]):
        text = num(c, value, thousands=",")
        if with_ci and text and lo is not None and hi is not None:
            text += _spread(_num(value), _num(lo.iloc[i]), _num(hi.iloc[i]), d)
        out.append(text)
    return out


def _spread(value: float, low: float, high: float, d: int) -> str:
    """An interval beside its value: ` ±h` where it is symmetric at the column's decimals, else ` +up/-down`
    (rep_4 at 0 with [0, 0.369] read `±0.185`, as if it reached -0.185 and stopped at 0.185); nothing where
    it has no width at those decimals, or is missing."""
    if not all(map(math.isfinite, (value, low, high))):
        return ""
    up, down = f"{max(high - value, 0.0):.{d}f}", f"{max(value - low, 0.0):.{d}f}"
    if up.strip("0.") == "" and down.strip("0.") == "":  # a zero-width interval says nothing
        return ""
    return f" ±{up}" if up == down else f" +{up}/-{down}"


def summary_columns(summary: pd.DataFrame) -> dict[str, list[str]]:
    """header -> its cells' texts, in order of importance; empty columns left out."""
    num = ColumnFormat(summary)
    cols: dict[str, list[str]] = {
        "model": ["" if r["strategy"] == REFERENCE else terminal(r["model"]) for _, r in summary.iterrows()],
        "strategy": [terminal(label) for label in variant_labels(summary)],
    }
    for c in importance(summary):
        if not summary[c].notna().any():
            continue
        cols[SHORT.get(c, c)] = _column(summary, c, c not in COUNTS, num)
    return cols


def importance(summary: pd.DataFrame) -> list[str]:
    """The value columns, most important first: tokens/s, then the sweep's quality metrics (task accuracy
    first, then `format.CONCISE`'s in RANK's order, then the registered ones beyond DESIGN's columns: MAUVE,
    ratings, ...), then the sample size, latency and memory, which a narrow terminal drops first."""
    quality = metric_columns(summary)
    accuracy = accuracy_columns(summary)
    concise = [c for c in RANK if c in quality] + [c for c in CONCISE if c in quality and c not in RANK]
    rest = [c for c in quality if c not in [*accuracy, *QUALITY_COLUMNS] and not c.startswith("engine_")]
    tail = ["n_generations", "latency_ms_p50", "peak_memory_mb"]
    order = ["tokens_per_s", *accuracy, *concise, *rest, *tail]
    return [c for c in dict.fromkeys(order) if c in summary.columns]


def fit(cols: dict[str, list[str]], width: int) -> tuple[list[str], int]:
    """The headers that fit `width` (dropping from the least important), and how many were dropped."""
    order = list(cols)
    keep = [h for h in order if h in ("model", "strategy", SHORT.get("tokens_per_s"))]

    def need(headers: list[str]) -> int:  # rich's simple box: one space each side, one between
        return sum(max(len(h), *(len(x) for x in cols[h])) + 3 for h in headers) + 1

    shown = list(order)
    while need(shown) > width and len(shown) > len(keep):
        drop = next(h for h in reversed(shown) if h not in keep)
        shown.remove(drop)
    return shown, len(order) - len(shown)


def summary_table(summary: pd.DataFrame, width: int) -> Table:
    cols = summary_columns(summary)
    shown, dropped = fit(cols, width)
    caption = f"{dropped} more column(s) in the report" if dropped else None
    table = Table(box=None, pad_edge=False, header_style="bold", caption=caption, caption_justify="left")
    for h in shown:
        table.add_column(h, justify="left" if h in ("model", "strategy") else "right", no_wrap=True)
    for i in range(len(summary)):
        style = "dim" if summary.iloc[i]["strategy"] == REFERENCE else ""
        table.add_row(*(Text(cols[h][i]) for h in shown), style=style)
    return table


def print_summary(summary: pd.DataFrame, console: Console | None = None) -> None:
    """The fitted table on `console` (default: stdout at the terminal's width)."""
    console = console or Console(highlight=False)
    console.print(summary_table(summary, console.width))


def echo_summary(summary: pd.DataFrame, *, nl: bool = True) -> None:
    """At a terminal the fitted table; on a pipe or in a file the Markdown table. The intervals' small-sample
    caution, where there is one for the columns it can show, or why there are no intervals, on stderr."""
    from controller.report.render.format import concise_columns, markdown_table, small_sample_note

    if click.get_text_stream("stdout").isatty():
        print_summary(summary)
        shown = importance(summary)
    else:
        click.echo(markdown_table(summary), nl=nl)
        shown = concise_columns(summary)
    if note := small_sample_note(summary.attrs.get("ci"), shown) or summary.attrs.get("no_ci"):
        click.echo(note, err=True)
