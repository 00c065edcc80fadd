"""report.html's summary table: on screen one sortable table whose columns are grouped under a
header row (cell · quality · speed · sample · other: the quality metrics on the first screen; a column
empty for the whole sweep left out), the cell's columns sticky while the rest
scrolls, every interval on hover; in print, the same rows split by metric group into tables
narrow enough for a landscape page (report.css hides the one or the others).

Presentation only: values and intervals are the summary's, formatted per column by `format.ColumnFormat`."""

from __future__ import annotations

import html
import math

import pandas as pd

from controller.report.compute.columns import KEY_COLUMNS, REFERENCE, SPEED_COLUMNS
from controller.report.compute.engines import ENGINE_COLUMN
from controller.report.render.format import ColumnFormat, metric_columns, params_label
from controller.report.render.labels import cell_labels, variant_labels
from controller.report.stats.paired import is_comparison_column

e = html.escape
SAMPLE = ["n_prompts", "n_generations", "n_seeds"]
PRINT_COLUMNS = 8  # value columns per printed table: fits an A4 landscape page at the print font


def column_groups(summary: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """(group, columns) in display order; the cell's key columns first, empty groups left out."""
    cols = [c for c in summary.columns if "_ci_" not in c and c != "cell" and not is_comparison_column(c)]
    quality = set(metric_columns(summary))
    speed_first = [c for c in SPEED_COLUMNS if c in cols]
    keys = [c for c in ["model", "strategy", ENGINE_COLUMN] if c in cols]  # params: on the label's hover
    speed_first = [c for c in speed_first if summary[c].notna().any()]
    groups: dict[str, list[str]] = {"cell": keys, "quality": [], "speed": speed_first, "sample": [], "other": []}
    for c in cols:
        if c in keys or c in speed_first or not summary[c].notna().any():  # a column empty for the whole sweep
            continue
        group = "sample" if c in SAMPLE else "quality" if c in quality else "speed" if _is_speed(c) else "other"
        groups[group].append(c)
    return [(g, cs) for g, cs in groups.items() if cs]


def _is_speed(c: str) -> bool:
    return c.startswith(("tokens_per_s", "latency_", "ttft_", "decode_", "joules_", "nvml_", "gpu_", "memory_"))


def _missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _cell(row, c: str, num: ColumnFormat, key: bool = False, label: str = "") -> str:
    """A table cell; the strategy column shows the variant's `label`, every parameter on hover."""
    v = row[c]
    missing = _missing(v)
    text = "" if missing else params_label(v) if c == "params" else (str(v) if isinstance(v, str) else num(c, v))
    title = ""
    if c == "strategy" and label:
        text, v = label, label
        title = f' title="{e(params_label(row.get("params")))}"' if row.get("params") not in (None, "{}") else ""
    lo, hi = row.get(f"{c}_ci_low"), row.get(f"{c}_ci_high")
    if not missing and lo is not None and not pd.isna(lo):
        title = f' title="95% CI [{e(num(c, lo))}, {e(num(c, hi))}]"'
    classes = " ".join(k for k, on in (("t", isinstance(v, str) or c in KEY_COLUMNS), ("k", key)) if on)
    klass = f' class="{classes}"' if classes else ""
    return f'<td{klass} data-v="{e("" if missing else str(v))}"{title}>{e(text)}</td>'


def _head_class(c: str, keys: set[str]) -> str:
    return "t k" if c in keys else "t" if c == "memory_kind" else ""


def summary_table(summary: pd.DataFrame) -> str:
    """The screen's table and the print's tables."""
    groups = column_groups(summary)
    group_row = "".join(f'<th colspan="{len(cs)}" class="g g-{e(g)}">{e(g)}</th>' for g, cs in groups)
    cols = [c for _, cs in groups for c in cs]
    keys = set(groups[0][1]) if groups and groups[0][0] == "cell" else set()
    head = "".join(f'<th data-col="{e(c)}" class="{_head_class(c, keys)}">{e(c)}</th>' for c in cols)
    body, num = [], ColumnFormat(summary)
    for label, (_, row) in zip(variant_labels(summary), summary.iterrows()):
        klass = ' class="reference"' if row["strategy"] == REFERENCE else ""
        body.append(f"<tr{klass}>{''.join(_cell(row, c, num, c in keys, label) for c in cols)}</tr>")
    return (
        f'<div class="scroll screen-only"><table id="summary-table" class="sortable"><thead>'
        f'<tr class="groups">{group_row}</tr><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
        + print_tables(summary, groups)
    )


def print_tables(summary: pd.DataFrame, groups: list[tuple[str, list[str]]]) -> str:
    """One table per metric group (cut at PRINT_COLUMNS columns), each row named by its cell's label."""
    labels = cell_labels(summary)
    parts, num = [], ColumnFormat(summary)
    for group, cs in groups:
        if group == "cell":
            continue
        for start in range(0, len(cs), PRINT_COLUMNS):
            chunk = cs[start : start + PRINT_COLUMNS]
            head = '<th class="t">cell</th>' + "".join(f"<th>{e(c).replace('_', '_<wbr>')}</th>" for c in chunk)
            rows = [
                f'<tr><td class="t">{e(label)}</td>{"".join(_cell(row, c, num) for c in chunk)}</tr>'
                for label, (_, row) in zip(labels, summary.iterrows())
            ]
            title = group + (f" ({start // PRINT_COLUMNS + 1})" if len(cs) > PRINT_COLUMNS else "")
            parts.append(
                f'<table class="print-table"><caption>{e(title)}</caption><thead><tr>{head}</tr></thead>'
                f"<tbody>{''.join(rows)}</tbody></table>"
            )
    return f'<div class="print-only">{"".join(parts)}</div>'
