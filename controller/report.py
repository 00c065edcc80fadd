"""Reports of a sweep: summary.{csv,parquet,json,md} and report.html under `report/`.

`write_reports` renders a summary (from `controller.aggregate.summarize`) into every
format and writes it through the store; `markdown_table` is the concise table the
terminal shows; `report` is the `decodebench report` command.
"""

from __future__ import annotations

import io
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import pandas as pd

from controller.aggregate import (
    DESIGN_COLUMNS,
    KEY_COLUMNS,
    SweepData,
    compare,
    load_sweep,
    metric_columns,
    summarize,
)
from controller.settings import configured_store, setting
from worker import paths
from worker.errors import UsageError
from worker.store import Store

FORMATS = ("md", "csv", "parquet", "json", "html")
FILENAMES = {"csv": "summary.csv", "parquet": "summary.parquet", "json": "summary.json",
             "md": "summary.md", "html": "report.html"}
# The terminal table: the columns a reader scans first (empty ones are dropped).
CONCISE = ["model", "strategy", "params", "n_generations", "tokens_per_s", "latency_ms_p50", "peak_memory_mb",
           "mean_length", "rep_4", "diversity", "self_bleu_4", "perplexity", "bleu", "rouge_l"]
SHORT = {"n_generations": "n", "tokens_per_s": "tok/s", "latency_ms_p50": "p50 ms", "latency_ms_p95": "p95 ms",
         "ttft_ms_p50": "ttft ms", "peak_memory_mb": "mem MB", "mean_length": "len"}


# -- formatting ---------------------------------------------------------------------------

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


def params_label(params: str | None) -> str:
    """`{"p":0.9,"temperature":1.0}` -> `p=0.9, temperature=1.0`."""
    try:
        loaded = json.loads(params or "{}")
    except (TypeError, ValueError):
        return str(params)
    return ", ".join(f"{k}={v}" for k, v in loaded.items()) if isinstance(loaded, dict) else str(params)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(summary: pd.DataFrame, columns: list[str] | None = None, *, with_ci: bool = False) -> str:
    """A GitHub Markdown table; by default the concise columns, all-empty ones dropped."""
    if columns is None:
        columns = [c for c in CONCISE if c in summary.columns]
    keep = [c for c in columns if c in KEY_COLUMNS or summary[c].notna().any()]
    header = [SHORT.get(c, c) for c in keep]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if c in ("model", "strategy", "params") else "---:" for c in keep) + "|"]
    for _, row in summary.iterrows():
        cells = []
        for c in keep:
            value = row[c]
            text = params_label(value) if c == "params" else fmt(value)
            lo, hi = row.get(f"{c}_ci_low"), row.get(f"{c}_ci_high")
            if with_ci and text and lo is not None and not pd.isna(lo):
                text += f" [{fmt(lo)}, {fmt(hi)}]"
            cells.append(_md_escape(text))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compare_table(comparison: pd.DataFrame) -> str:
    """The terminal view of `compare`: the concise metrics' B - A differences."""
    frame = comparison.copy()
    cols = list(KEY_COLUMNS) + ["present"]
    for c in CONCISE:
        if f"{c}_delta" in frame.columns:
            frame[f"Δ {SHORT.get(c, c)}"] = frame[f"{c}_delta"]
            cols.append(f"Δ {SHORT.get(c, c)}")
    return markdown_table(frame, cols)


def summary_markdown(summary: pd.DataFrame, data: SweepData) -> str:
    name = data.name
    ci = summary.attrs.get("ci")
    done = f"{len(data.results)} complete job(s)" + (f" of {data.planned_jobs}" if data.planned_jobs else "")
    lines = [f"# decodebench report: {name} ({data.sweep_id})", "",
             f"Tenant `{data.tenant}`, {done}, {len(data.generations)} generation(s). "
             f"Written {datetime.now(timezone.utc).isoformat(timespec='seconds')}.", ""]
    if ci:
        lines += [f"Intervals [low, high]: {ci['level']:.0%}, resampling prompts (all of a prompt's generations, "
                  f"every seed, move together); bootstrap with {ci['n_boot']} replicates where a metric has an "
                  f"exact fast path, else {ci['n_boot_corpus']}; half-sampling for the metrics that duplicated "
                  "generations distort. Methods: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(ci.get("methods", {}).items())) + ".", ""]
    lines += ["## Overview", "", markdown_table(summary), "## All columns", "",
              markdown_table(summary, [c for c in DESIGN_COLUMNS if c in summary.columns]
                             + [c for c in metric_columns(summary) if c not in DESIGN_COLUMNS], with_ci=bool(ci))]
    return "\n".join(lines)


def summary_json(summary: pd.DataFrame, data: SweepData) -> str:
    rows = json.loads(summary.to_json(orient="records", double_precision=15))
    return json.dumps({"sweep_id": data.sweep_id, "tenant": data.tenant, "name": data.name,
                       "ci": summary.attrs.get("ci"), "columns": list(summary.columns), "rows": rows}, indent=2)


def render(fmt_name: str, summary: pd.DataFrame, data: SweepData) -> bytes:
    if fmt_name == "csv":
        return summary.to_csv(index=False).encode()
    if fmt_name == "parquet":
        buf = io.BytesIO()
        summary.to_parquet(buf, index=False)
        return buf.getvalue()
    if fmt_name == "json":
        return summary_json(summary, data).encode()
    if fmt_name == "md":
        return summary_markdown(summary, data).encode()
    if fmt_name == "html":
        from controller.html import render_html  # plotly only where the HTML is made

        return render_html(summary, data).encode()
    raise UsageError(f"unknown report format {fmt_name!r}; valid: {', '.join(FORMATS)}")


def write_reports(store: Store, tenant: str, sweep_id: str, summary: pd.DataFrame, data: SweepData,
                  formats: tuple[str, ...] = FORMATS) -> dict[str, str]:
    """Write every format under the sweep's `report/`; return {format: store key}."""
    keys = {}
    for name in formats:
        key = paths.report_key(tenant, sweep_id, FILENAMES[name])
        store.write_bytes(key, render(name, summary, data))
        keys[name] = key
    return keys


def write_comparison(store: Store, tenant: str, sweep_a: str, sweep_b: str, comparison: pd.DataFrame) -> dict[str, str]:
    keys = {}
    for name, body in (("csv", comparison.to_csv(index=False).encode()), ("md", compare_table(comparison).encode())):
        key = paths.report_key(tenant, sweep_a, f"compare-{sweep_b}.{name}")
        store.write_bytes(key, body)
        keys[name] = key
    return keys


# -- the command ---------------------------------------------------------------------------

def resolve_sweep(store: Store, tenant: str, sweep: str) -> str:
    """A sweep id or a unique prefix of one."""
    if store.exists(paths.spec_key(tenant, sweep)):
        return sweep
    matches = [s for s in store.list_sweeps(tenant) if s.startswith(sweep)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise UsageError(f"sweep prefix {sweep!r} is ambiguous: {', '.join(matches[:5])}")
    raise UsageError(f"no sweep {sweep!r} for tenant {tenant!r} in {store.url}")


def build(store: Store, tenant: str, sweep: str, n_boot: int = 1000) -> tuple[SweepData, pd.DataFrame]:
    sweep_id = resolve_sweep(store, tenant, sweep)
    data = load_sweep(store, tenant, sweep_id)
    if not data.results:
        raise UsageError(f"sweep {sweep_id} has no complete jobs yet; see `decodebench status {sweep_id}`")
    return data, summarize(data, n_boot=n_boot)


@click.command("report")
@click.argument("sweep")
@click.option("--format", "fmt_name", type=click.Choice(FORMATS), default="md", show_default=True,
              help="Format copied to --out.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also copy the chosen format to this local file.")
@click.option("--compare", "compare_to", default=None, metavar="SWEEP_B",
              help="Compare with another sweep: per-cell differences B - A.")
@click.option("--n-boot", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Bootstrap replicates of the confidence intervals (0: none).")
@click.option("--store", "store_url", default=None, help="Store URL  [default: $DECODEBENCH_STORE or ./runs]")
@click.option("--tenant", default=None, help="Tenant  [default: $DECODEBENCH_TENANT or default]")
def report(sweep: str, fmt_name: str, out: Path | None, compare_to: str | None, n_boot: int,
           store_url: str | None, tenant: str | None) -> None:
    """Aggregate SWEEP's complete jobs into report/summary.* and report/report.html."""
    if compare_to is not None and fmt_name == "html":
        raise UsageError("--compare writes md, csv, json or parquet, not html")
    tenant = setting("tenant", tenant)
    try:
        paths.check_tenant(tenant)
    except ValueError as err:
        raise UsageError(str(err)) from None
    store = configured_store(store_url)
    data, summary = build(store, tenant, sweep, n_boot)
    write_reports(store, tenant, data.sweep_id, summary, data)
    if compare_to is None:
        click.echo(markdown_table(summary), nl=False)
        body = render(fmt_name, summary, data) if out else None
    else:
        sweep_b = resolve_sweep(store, tenant, compare_to)
        _, other = build(store, tenant, sweep_b, n_boot)
        comparison = compare(summary, other)
        write_comparison(store, tenant, data.sweep_id, sweep_b, comparison)
        click.echo(compare_table(comparison), nl=False)
        body = _comparison_bytes(fmt_name, comparison) if out else None
    if out is not None and body is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(body)
        click.echo(f"wrote {out}", err=True)
    click.echo(f"report: {store.url}/{paths.report_key(tenant, data.sweep_id, '')}", err=True)


def _comparison_bytes(fmt_name: str, comparison: pd.DataFrame) -> bytes:
    if fmt_name == "csv":
        return comparison.to_csv(index=False).encode()
    if fmt_name == "json":
        return comparison.to_json(orient="records", indent=2, double_precision=15).encode()
    if fmt_name == "parquet":
        buf = io.BytesIO()
        comparison.to_parquet(buf, index=False)
        return buf.getvalue()
    return compare_table(comparison).encode()
