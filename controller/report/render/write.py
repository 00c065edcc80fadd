"""Writing a sweep's reports through the store: summary.{csv,parquet,json,md} and report.html
under `report/`, and the comparison of two sweeps."""

from __future__ import annotations

import io

import pandas as pd

from controller.report.compute.aggregate import summarize
from controller.report.compute.runner import Runner
from controller.report.load.sweep import SweepData, load_sweep
from controller.report.render.format import compare_table, summary_json, summary_markdown
from worker.core import paths
from worker.core.errors import UsageError
from worker.core.safetext import csv_cell
from worker.store import Store

FORMATS = tuple(paths.REPORT_FILES)


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """A DataFrame as CSV that a spreadsheet opens safely: every text cell through `csv_cell`
    (a name, params or prompt starting with `=`, `+`, `-`, `@` gets a leading `'`); numbers stay numbers."""
    safe = frame.copy()
    for col in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[col]):
            safe[col] = safe[col].map(csv_cell)
    return safe.to_csv(index=False).encode()


def render(fmt_name: str, summary: pd.DataFrame, data: SweepData, print_samples: bool | None = None) -> bytes:
    """One format's bytes; `print_samples` is report.html's (html.render_html; None: by the sweep's size)."""
    if fmt_name == "csv":
        return csv_bytes(summary)
    if fmt_name == "parquet":
        buf = io.BytesIO()
        summary.to_parquet(buf, index=False)
        return buf.getvalue()
    if fmt_name == "json":
        return summary_json(summary, data).encode()
    if fmt_name == "md":
        return summary_markdown(summary, data).encode()
    if fmt_name == "html":
        from controller.report.render.html import render_html  # plotly only where the HTML is made

        return render_html(summary, data, print_samples).encode()
    raise UsageError(f"unknown report format {fmt_name!r}; valid: {', '.join(FORMATS)}")


def write_reports(
    store: Store,
    tenant: str,
    sweep_id: str,
    summary: pd.DataFrame,
    data: SweepData,
    formats: tuple[str, ...] = FORMATS,
    print_samples: bool | None = None,
) -> dict[str, str]:
    """Write every format under the sweep's `report/`; return {format: store key}."""
    keys = {}
    for name in formats:
        key = paths.report_key(tenant, sweep_id, paths.REPORT_FILES[name])
        store.write_bytes(key, render(name, summary, data, print_samples))
        keys[name] = key
    return keys


def write_comparison(store: Store, tenant: str, sweep_a: str, sweep_b: str, comparison: pd.DataFrame) -> dict[str, str]:
    keys = {}
    for name, body in (("csv", csv_bytes(comparison)), ("md", compare_table(comparison).encode())):
        key = paths.report_key(tenant, sweep_a, f"compare-{sweep_b}.{name}")
        store.write_bytes(key, body)
        keys[name] = key
    return keys


def build(
    store: Store,
    tenant: str,
    sweep: str,
    n_boot: int = 1000,
    baseline: str | None = None,
    workers: int = 1,
    remote=None,
    progress=None,
) -> tuple[SweepData, pd.DataFrame]:
    """Load SWEEP's results (not its generations: each cell streams its own) and summarise it;
    `workers` cells at a time in a process pool, each cell's output cached in the store; `remote`
    (controller.report.distribute.remote.ReportWorkers): the cells and pairs missing from the cache computed by
    report workers;
    `progress(what, done, total)`: the results read, the cells, the pairs (controller.cli.progress)."""
    sweep_id = store.resolve_sweep(tenant, sweep)
    data = load_sweep(store, tenant, sweep_id, with_generations=False, progress=progress)
    if not data.results:
        raise UsageError(f"sweep {sweep_id} has no complete jobs yet; see `decodebench status {sweep_id}`")
    summary = summarize(
        data, n_boot=n_boot, baseline=baseline, workers=workers, store=store, remote=remote, progress=progress
    )
    return data, with_extras(summary, store, data, n_boot, Runner(workers, remote, progress))


def with_extras(summary: pd.DataFrame, store: Store, data: SweepData, n_boot: int = 1000, runner=None) -> pd.DataFrame:
    """The summary with what lives beside the jobs: imported human ratings and the sweep's judge (docs/judge.md),
    its requests sent by `runner`'s backends (default: here)."""
    from controller.judge.report import add_judge, judge_summary
    from controller.report.ratings.scores import add_ratings, stored_ratings

    tenant, sweep_id = data.tenant, data.sweep_id
    spec, results, order = data.sweep_spec, data.results, data.cell_order
    judged = judge_summary(store, tenant, sweep_id, spec, results, order, n_boot, runner=runner)
    return add_judge(add_ratings(summary, stored_ratings(store, tenant, sweep_id)), judged)


def comparison_bytes(fmt_name: str, comparison: pd.DataFrame) -> bytes:
    if fmt_name == "csv":
        return csv_bytes(comparison)
    if fmt_name == "json":
        return comparison.to_json(orient="records", indent=2, double_precision=15).encode()
    if fmt_name == "parquet":
        buf = io.BytesIO()
        comparison.to_parquet(buf, index=False)
        return buf.getvalue()
    return compare_table(comparison).encode()
