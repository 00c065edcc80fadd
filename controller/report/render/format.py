"""Formatting a summary for people: numbers, the Markdown tables and summary.md (summary.json: write.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from controller.judge.report import judge_markdown
from controller.report.compute.columns import (
    DESIGN_COLUMNS,
    EXTRA_SPEED_COLUMNS,
    ID_COLUMNS,
    KEY_COLUMNS,
    MAUVE_COLUMNS,
    PAIRED_COLUMN,
    PROMPTS_ATTR,
    SAMPLES_COLUMNS,
    SPEED_COLUMNS,
)
from controller.report.compute.engines import ENGINE_COLUMN
from controller.report.load.jobs import CALIBRATED_PROMPTS
from controller.report.load.sweep import SweepData
from controller.report.render.comparisons import (
    FIRSTS,
    across_note,
    comparison_markdown,
    comparison_table,
    floor_note,
    untested_note,
)
from controller.report.render.labels import cell_labels, labeller, variant_labels
from controller.report.render.ratings_table import RATINGS_NOTE, rating_table
from controller.report.stats.paired import is_comparison_column, on_first_generations
from controller.report.stats.speed import SPREAD_COLUMNS
from worker.core.safetext import markdown

# The terminal table: the columns a reader scans first (empty ones are dropped).
CONCISE = [
    "model",
    "strategy",  # the variant's label (controller.report.render.labels): its parameters and samples
    "n_generations",
    "tokens_per_s",
    "latency_ms_p50",
    "peak_memory_mb",
    "mean_length",
    "rep_4",
    "diversity",
    "self_bleu_4",
    "perplexity",
    "bleu",
    "rouge_l",
]
ACCURACY_PREFIXES = ("exact_match", "pass@", "maj@", "pass_at")  # and any metric named "...accuracy..."
SHORT = {
    "n_generations": "n",
    "tokens_per_s": "tok/s",
    "latency_ms_p50": "p50 ms",
    "latency_ms_p95": "p95 ms",
    "ttft_ms_p50": "ttft ms",
    "peak_memory_mb": "mem MB",
    "mean_length": "len",
}


def fmt(value: Any) -> str:
    """A cell for humans: empty for missing, about three significant digits for numbers."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value)}"
    a = abs(value)
    if a >= 1000:
        return f"{value:.0f}"
    if a >= 100:
        return f"{value:.1f}"
    if a >= 1 or a == 0:
        return f"{value:.2f}"
    return f"{value:.3f}" if a >= 0.001 else f"{value:.2e}"


def is_count(column: str) -> bool:
    """Columns that count things (generations, prompts, jobs, clusters): whole numbers, no decimals."""
    column = column.removeprefix("Δ ").removesuffix("_delta")  # a difference of counts is a count
    short = {v: k for k, v in SHORT.items()}.get(column, column)
    return short.startswith("n_") or short in ("samples", "mauve_n", "mauve_n_references", "mauve_clusters")


def decimals(values, *, count: bool = False) -> int:
    """One number format per column, i.e. per metric, so that a column never mixes `0.00`, `2.58e-04` and
    `0.786`: by its largest magnitude, 0 decimals from 1000, 1 from 100, 2 from 10, else 3; a column whose
    largest value is below 0.01 gets three significant digits of it (at most 6 decimals); counts none."""
    if count:
        return 0
    finite = [abs(float(v)) for v in values if _number(v) and math.isfinite(float(v))]
    top = max(finite, default=0.0)
    if top >= 1000 or top >= 100 or top >= 10:
        return 0 if top >= 1000 else 1 if top >= 100 else 2
    if top >= 0.01 or top == 0:
        return 3
    return min(6, 2 - math.floor(math.log10(top)))


def column_format(values: list) -> Callable[[Any], str]:
    """One column's formatter: its values' `decimals`, "" for a missing one (the comparisons' Δ columns; a
    difference that rounds to zero keeps its sign, `-0.000`: an interval's end below zero stays below it)."""
    places = decimals(values)
    return lambda v: f"{float(v):.{places}f}" if _number(v) and not math.isnan(float(v)) else ""


def _number(v) -> bool:
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class ColumnFormat:
    """The numbers of a summary (or any frame of its columns) as people read them: every numeric column with
    its own `decimals`, its intervals with the same; `fmt` for what is not a numeric column. The Markdown
    tables, summary.md, the HTML table and the terminal's table all format through it."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self._decimals: dict[str, int | None] = {}

    def decimals(self, column: str) -> int | None:
        if column not in self._decimals:
            col = self.frame[column] if column in self.frame.columns else None
            numeric = (
                col is not None
                and pd.api.types.is_numeric_dtype(col)
                and not pd.api.types.is_bool_dtype(col)
                and column not in KEY_COLUMNS
            )
            self._decimals[column] = decimals(col.tolist(), count=is_count(column)) if numeric else None
        return self._decimals[column]

    def __call__(self, column: str, value: Any, thousands: str = "") -> str:
        """`value` in `column`'s format ("" when missing); `thousands` "," groups the digits (the terminal)."""
        d = self.decimals(column)
        if d is None or not _number(value):
            return fmt(value)
        v = float(value.item() if hasattr(value, "item") else value)
        return "" if math.isnan(v) else f"{v:{thousands}.{d}f}"


def params_label(params: str | None) -> str:
    """`{"p":0.9,"temperature":1.0}` -> `p=0.9, temperature=1.0`."""
    try:
        loaded = json.loads(params or "{}")
    except (TypeError, ValueError):
        return str(params)
    return ", ".join(f"{k}={v}" for k, v in loaded.items()) if isinstance(loaded, dict) else str(params)


def accuracy_columns(summary: pd.DataFrame) -> list[str]:
    """A task sweep's accuracy columns (exact_match, pass@k, maj@k, a plugin's "...accuracy..."), in the summary's
    order: what a task sweep's reader looks for first."""
    return [c for c in metric_columns(summary) if "accuracy" in c or c.startswith(ACCURACY_PREFIXES)]


def concise_columns(summary: pd.DataFrame) -> list[str]:
    """The overview's columns (summary.md, the table `run` and `report` print on a pipe): CONCISE's, with the
    sweep's accuracy columns before its text metrics."""
    at = CONCISE.index("mean_length")
    return [c for c in CONCISE[:at] + accuracy_columns(summary) + CONCISE[at:] if c in summary.columns]


def markdown_table(
    summary: pd.DataFrame,
    columns: list[str] | None = None,
    *,
    with_ci: bool = False,
    marks: Callable[[pd.Series, str], str] | None = None,
) -> str:
    """A GitHub Markdown table; by default the concise columns (`concise_columns`), all-empty ones dropped. The
    strategy column names each row's variant by its label (`top_p(p=0.8)`); a `params` column gives every
    parameter. `marks(row, column)`: what follows a value (`compare_table`'s test marks)."""
    if columns is None:
        columns = concise_columns(summary)
    keep = [c for c in columns if c in KEY_COLUMNS or summary[c].notna().any()]
    header = [SHORT.get(c, c) for c in keep]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if c in ("model", "strategy", "params") else "---:" for c in keep) + "|",
    ]
    num = ColumnFormat(summary)
    for variant, (_, row) in zip(variant_labels(summary), summary.iterrows()):
        cells = []
        for c in keep:
            value = row[c]
            text = variant if c == "strategy" else params_label(value) if c == "params" else num(c, value)
            lo, hi = row.get(f"{c}_ci_low"), row.get(f"{c}_ci_high")
            if with_ci and text and lo is not None and not pd.isna(lo):
                text += f" [{num(c, lo)}, {num(c, hi)}]"
            if text and marks is not None:
                text += marks(row, c)
            if c == "mauve" and text and not pd.isna(row.get("mauve_n")):  # its sample beside the value
                text += f" (n {row['mauve_n']}, refs {row['mauve_n_references']}, k {row['mauve_clusters']})"
            cells.append(markdown(text))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compare_table(comparison: pd.DataFrame) -> str:
    """The terminal view of `compare`: the B - A differences of the overview's columns (a task sweep's accuracy
    among them), each marked where the sweeps' paired test finds it (`compare.paired_across`), and what they are."""
    frame = comparison.copy()
    cols = ["model", "strategy", "present"]  # the strategy column: the variant's label
    deltas = pd.DataFrame({c.removesuffix("_delta"): frame[c] for c in frame.columns if c.endswith("_delta")})
    metric_of = {}
    for c in concise_columns(deltas):
        frame[f"Δ {SHORT.get(c, c)}"] = frame[f"{c}_delta"]
        cols.append(f"Δ {SHORT.get(c, c)}")
        metric_of[f"Δ {SHORT.get(c, c)}"] = c

    def marks(row: pd.Series, column: str) -> str:
        metric = metric_of.get(column)  # None: model, strategy, present
        p = row.get(f"{metric}_diff_p_holm") if metric else None
        found = "*" if p is not None and not pd.isna(p) and p < 0.05 else ""
        return found + (f" {FIRSTS}" if metric in on_first_generations(row) else "")

    if not (PAIRED_COLUMN in frame.columns and frame[PAIRED_COLUMN].notna().any()):
        return markdown_table(frame, cols, marks=marks) + "\n" + untested_note(comparison.attrs.get(PROMPTS_ATTR))
    firsts = any(on_first_generations(row) for _, row in frame.iterrows())
    return markdown_table(frame, cols, marks=marks) + "\n" + across_note(firsts, floor_note(comparison)) + "\n"


def model_based_metrics(data: SweepData) -> str:
    """Which models the model-based metrics used: the scorer (perplexity, coherence) and the
    MAUVE featurizer with its max length, as the sweep set them (values compare only under the same)."""
    spec = data.sweep_spec

    def label(model) -> str | None:
        if not isinstance(model, dict) or not model.get("path"):
            return None
        return str(model.get("name") or str(model["path"]).rstrip("/").split("/")[-1])

    scorer = label(spec.get("scorer")) or "each cell's own model"
    text = f"Perplexity and coherence scored by {markdown(scorer)}."
    featurizer = label(spec.get("featurizer"))
    if featurizer:
        limit = spec.get("featurizer_max_tokens", 1024)
        text += f" MAUVE features from {markdown(featurizer)} (at most {limit} tokens)."
    return text


def summary_markdown(summary: pd.DataFrame, data: SweepData) -> str:
    name = data.name
    ci = summary.attrs.get("ci")
    done = markdown(data.completeness())
    missing = data.missing_note()
    lines = [
        f"# decodebench report: {markdown(name)} ({data.sweep_id})",
        "",
        f"Tenant `{data.tenant}`, {done}, {data.n_generations} generation(s). "
        f"Written {datetime.now(UTC).isoformat(timespec='seconds')}.",
        "",
        *([f"**{markdown(missing)}**", ""] if missing else []),
        model_based_metrics(data),
        "",
    ]
    if ci:
        lines += [
            f"Intervals [low, high]: {ci['level']:.0%}, resampling prompts (all of a prompt's generations, "
            f"every seed, move together); studentised bootstrap with {ci['n_boot']} replicates for the metrics "
            "that sum per-generation statistics (never narrower than Student's t; the percentile interval where too "
            "many replicates have no spread; a share of one 0/1 outcome a prompt, e.g. greedy's exact_match or "
            "pass@k of k samples, or whose generations are all alike, e.g. no EOS: the exact binomial interval over "
            "prompts; exact_match of several answers a prompt: Korn and Graubard's, the exact one at its effective "
            "number of answers); the delete-one-prompt jackknife (Student's t of its pseudo-values, widened on the "
            "side of their skew) for the metrics that duplicated generations distort; every interval inside the "
            "values its metric can take. "
            "Methods: " + ", ".join(f"{k} {v}" for k, v in sorted(ci.get("methods", {}).items())) + ".",
            "",
        ]
        note = small_sample_note(ci)
        lines += [f"**{note}**", ""] if note else []
    elif summary.attrs.get("no_ci"):
        lines += [f"**{summary.attrs['no_ci']}**", ""]
    lines += [
        "## Overview",
        "",
        markdown_table(summary),
        *speed_markdown(summary),
        "## All columns",
        "",
        markdown_table(
            summary,
            [c for c in DESIGN_COLUMNS if c in summary.columns]
            + [c for c in metric_columns(summary) if c not in DESIGN_COLUMNS],
            with_ci=bool(ci),
        ),
        *ratings_markdown(summary),
        *judge_markdown(summary),
        *comparison_markdown(comparison_table(summary, fmt, labeller(summary), column_format), floor_note(summary)),
    ]
    return "\n".join(lines)


def small_sample_note(ci: dict | None, shown: Iterable[str] | None = None) -> str | None:
    """The caution a report's intervals carry when its smallest cell has fewer prompts than they were calibrated at:
    the house's `CALIBRATED_PROMPTS`, and more for a metric that declares it (`Metric.calibrated_prompts`, in
    `ci["calibrated"]`), of those among `shown` (None: every metric; the terminal names only the columns it
    prints); None where none applies, or without intervals."""
    if not ci:
        return None
    prompts = ci.get("prompts", CALIBRATED_PROMPTS)
    declared = ci.get("calibrated") or {}
    columns = None if shown is None else set(shown)
    later = {
        n: q
        for n, q in sorted(declared.items())
        if type(q) is int and prompts < q and (columns is None or n in columns)
    }
    level = f"{ci['level']:.0%}"
    sentences = []
    if prompts < CALIBRATED_PROMPTS:
        sentences.append(
            f"The smallest cell has {prompts} prompts: below {CALIBRATED_PROMPTS}, an interval can cover less than "
            f"{level} where a few prompts dominate a metric (rep-n measured at 88.6-92.0% with 16 prompts of which "
            'few loop; docs/reports.md, "Calibrated sizes").'
        )
    if later:
        start = "It is" if sentences else f"The smallest cell has {prompts} prompts,"
        if len(later) == 1:
            ((name, q),) = later.items()
            which, it = f"the {q} prompts at which {name}'s interval was calibrated", "it"
        else:
            listing = ", ".join(f"{n} {q}" for n, q in later.items())
            which, it = f"the prompts at which these metrics' intervals were calibrated ({listing})", "they"
        sentences.append(
            f"{start} fewer than {which}: with fewer {it} can cover less than {level} "
            '(docs/reports.md, "Calibrated sizes").'
        )
    return " ".join(sentences) or None


def speed_markdown(summary: pd.DataFrame) -> list[str]:
    """The note naming neighbouring cells whose tokens/s intervals overlap, and cells without one; nothing when
    all are resolved."""
    from controller.report.stats.speed import speed_note

    if "tokens_per_s_ci_low" not in summary.columns:
        return []
    cols = ["tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high"]
    labels = [markdown(label) for label in cell_labels(summary, with_model=True)]  # a label is a model's name
    rows = [
        (label, *(float(r[c]) if pd.notna(r[c]) else math.nan for c in cols))
        for label, (_, r) in zip(labels, summary.iterrows())
    ]
    note = speed_note(rows)
    return [note, ""] if note else []


def ratings_markdown(summary: pd.DataFrame) -> list[str]:
    table = rating_table(summary, fmt, labeller(summary))
    if table is None:
        return []
    (_, header), *rows = table
    lines = ["## Human ratings", "", RATINGS_NOTE, "", "| cell | " + " | ".join(header) + " |"]
    lines.append("|---|" + "---:|" * len(header))
    lines += ["| " + " | ".join([markdown(label), *cells]) + " |" for label, cells in rows]
    return [*lines, ""]


def metric_columns(summary: pd.DataFrame) -> list[str]:
    """The quality-metric columns of a summary (DESIGN's, then extra registered ones): numbers only, so that
    a label column (a two-engine sweep's `engine`) is never drawn or formatted as a metric."""
    skip = set(ID_COLUMNS + SPEED_COLUMNS + EXTRA_SPEED_COLUMNS + MAUVE_COLUMNS + SPREAD_COLUMNS + SAMPLES_COLUMNS)
    skip.add(ENGINE_COLUMN)
    return [
        c
        for c in summary.columns
        if c not in skip and "_ci_" not in c and not is_comparison_column(c) and not _textual(summary[c])
    ]


def _textual(column: pd.Series) -> bool:
    return column.map(lambda v: isinstance(v, str)).any()
