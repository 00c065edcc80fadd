"""`decodebench report`: aggregate a sweep's complete jobs into its reports."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from controller.cli import options
from controller.cli.options import location
from controller.cli.progress import ReportProgress, progress_mode
from worker.core import paths, settings
from worker.core.errors import UsageError
from worker.core.safetext import terminal

FORMATS = tuple(paths.REPORT_FILES)


@click.command("report")
@click.argument("sweep")
@click.option(
    "--format",
    "fmt_name",
    type=click.Choice(FORMATS),
    default="md",
    show_default=True,
    help="The format written to --output FILE, or printed instead of the table when given without --output "
    "(the store's report/ always gets every format).",
)
@click.option(
    "--output",
    "-o",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the chosen --format to this local file.",
)
@click.option("--out", "old_out", type=click.Path(dir_okay=False, path_type=Path), default=None, hidden=True)
@click.option(
    "--compare",
    "compare_to",
    default=None,
    metavar="SWEEP_B",
    help="Compare with another sweep: per-cell differences B - A, tested paired over the prompts both hold alike.",
)
@click.option(
    "--models",
    "model_pairs_given",
    multiple=True,
    metavar="A_MODEL=B_MODEL",
    help="With --compare: compare sweep A's model with sweep B's (repeatable); two sweeps of one model each are "
    "paired by themselves.",
)
@click.option(
    "--n-boot",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Bootstrap replicates of the confidence intervals and permutations of the tests (0: none; else at least 10).",
)
@click.option(
    "--baseline",
    default=None,
    metavar="STRATEGY|CELL",
    help="Compare every cell with this strategy (per model) or cell key; default: each model's first cell.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Cells aggregated in parallel processes (0: one per CPU).",
)
@click.option(
    "--print-samples/--no-print-samples",
    default=None,
    help="Whether report.html printed (or saved as PDF) carries the example texts; the page's "
    "checkbox changes it. Default: yes up to 16 cells, no above.",
)
@click.option(
    "--distributed",
    is_flag=True,
    help="Cells and paired comparisons missing from the cache computed, and a declared judge endpoint's requests "
    "sent, by the report workers (`decodebench report-worker`): one signed job per cell, then per pair, then per "
    "share of the judge's requests, enqueued by the submission server (--api) or, as the operator, here.",
)
@click.option(
    "--wait-s",
    type=settings.finite_float(0),
    default=300.0,
    show_default=True,
    help="With --distributed: cells or pairs still missing after this many seconds without one are computed here.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the judge requests the report would send (and those cached), send nothing, write nothing.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar (without a TTY: no progress lines).")
@settings.option("store", "--store", "store_url")
@options.tenant
@options.api
@options.redis_url
def report(
    sweep: str,
    fmt_name: str,
    out: Path | None,
    old_out: Path | None,
    compare_to: str | None,
    model_pairs_given: tuple[str, ...],
    n_boot: int,
    baseline: str | None,
    workers: int,
    print_samples: bool | None,
    distributed: bool,
    wait_s: float,
    dry_run: bool,
    no_progress: bool,
    store_url: str,
    tenant: str,
    api: str | None,
    redis_url: str,
) -> None:
    """Aggregate SWEEP's complete jobs into report/summary.* and report/report.html.

    The results are read from the store with your own credentials; with --api, the server
    says which tenant your token acts as (the store prefix to read)."""
    out, to_stdout = _output(fmt_name, out, old_out, compare_to, model_pairs_given)
    if api:
        tenant = _token_tenant(api)
    remote = _dispatch(api, redis_url, store_url, tenant, wait_s) if distributed else None
    from controller.cli.table import echo_summary
    from controller.report.api import build
    from controller.report.compute.compare import compare_sweeps, resolve_pairs
    from controller.report.render.format import compare_table
    from controller.report.render.write import comparison_bytes, render, write_comparison, write_reports
    from worker.store import open_store

    store = open_store(store_url)
    if dry_run:
        return _dry_run(store, tenant, sweep)
    if compare_to is not None:  # both sweeps and the model pairs checked before either is aggregated
        _, sweep_b, pairs = resolve_pairs(store, tenant, sweep, compare_to, model_pairs_given)
    if out is not None:  # a path that cannot be written fails now, in one line, not after the whole report
        out.parent.mkdir(parents=True, exist_ok=True)
    with ReportProgress(progress_mode(no_progress)) as tick:
        data, summary = build(store, tenant, sweep, n_boot, baseline, workers, remote, progress=tick)
    write_reports(store, tenant, data.sweep_id, summary, data, print_samples=print_samples)
    if compare_to is None:
        body = render(fmt_name, summary, data, print_samples) if out or to_stdout else None
        if not to_stdout:
            echo_summary(summary, nl=False)
    else:
        data_b, other = build(store, tenant, sweep_b, n_boot, workers=workers)
        comparison = compare_sweeps(store, (data, summary), (data_b, other), n_boot, pairs)
        write_comparison(store, tenant, data.sweep_id, sweep_b, comparison)
        body = comparison_bytes(fmt_name, comparison) if out or to_stdout else None
        if not to_stdout:
            click.echo(compare_table(comparison), nl=False)
    _emit(body, out, to_stdout)
    click.echo(f"report: {location(store, paths.report_key(tenant, data.sweep_id, 'report.html'))}", err=True)
    _incomplete(summary, data)


def _incomplete(summary, data) -> None:
    """A report missing planned jobs says so (a cell with no complete job is in no table); one written without the
    judge's verdicts (over its budget: `judge.report.not_judged`) ends on that line as an error; one written
    without damaged records, exit status 1."""
    from controller.judge.report import not_judged

    if note := data.incomplete_note():
        click.echo(terminal(note), err=True)
    if why := not_judged(summary):
        raise UsageError(why)
    if data.damaged:
        raise SystemExit(1)


def _output(
    fmt_name: str, out: Path | None, old_out: Path | None, compare_to: str | None, model_pairs: tuple[str, ...] = ()
) -> tuple[Path | None, bool]:
    """Where the report's own format goes: (the file of --output, whether stdout takes it instead of the
    table: a --format given without --output); the refusals of combinations that cannot be written."""
    if model_pairs and compare_to is None:
        raise UsageError("--models pairs the models of two sweeps: give it with --compare SWEEP_B")
    if compare_to is not None and fmt_name == "html":
        raise UsageError("--compare writes md, csv, json or parquet, not html")
    if old_out is not None:
        click.echo("note: report --out FILE is now --output FILE (-o); --out will go", err=True)
        out = out or old_out
    to_stdout = out is None and click.get_current_context().get_parameter_source("fmt_name").name == "COMMANDLINE"
    if to_stdout and fmt_name == "parquet" and sys.stdout.isatty():
        raise UsageError("--format parquet is binary: give --output FILE (or redirect stdout)")
    return out, to_stdout


def _emit(body: bytes | None, out: Path | None, to_stdout: bool) -> None:
    if to_stdout and body is not None:  # `--format csv > summary.csv`: that format on stdout, not the table
        click.get_binary_stream("stdout").write(body)
    elif out is not None and body is not None:
        out.write_bytes(body)
        click.echo(f"wrote {terminal(str(out))}", err=True)


@click.command("report-worker")
@click.argument("tenants", nargs=-1)
@click.option("--burst", is_flag=True, help="Exit once no report job of the queues is queued.")
@click.option("--max-jobs", type=click.IntRange(min=1), default=None, help="Exit after this many jobs.")
@settings.option("store", "--store", "store_url")
@options.redis_url
@settings.option("log_format", type=click.Choice(["console", "json"]))
@settings.option("log_level")
def report_worker(
    tenants: tuple[str, ...], burst: bool, max_jobs: int | None, store_url: str, redis_url: str, log_format: str,
    log_level: str,
) -> None:  # fmt: skip
    """Compute report cells and pairs, and send judge requests, for `decodebench report --distributed`: the
    jobs of the report queues of TENANTS (default '*': every tenant, or the tenants file's), each signed, each
    read from this process's store (a judge endpoint from this process's tenants file)."""
    import logging

    from controller.report.distribute.mapworker import report_worker as make
    from worker.core.logs import configure
    from worker.core.redisconn import connect_patiently
    from worker.core.signing import load_key
    from worker.core.tenants import load_tenants
    from worker.store import open_store

    configure(log_format, log_level)
    for name in ("rq.worker", "rq.job", "rq.queue", "rq.registry"):  # RQ's own lines at the same level
        logging.getLogger(name).setLevel(str(log_level).upper())
    store = open_store(store_url)
    conn = connect_patiently(redis_url)
    key = load_key(settings.get("signing_key_file"))
    limit = int(settings.get("max_job_mb")) * 2**20
    path = settings.get("tenants_file")
    declared = [t.name for t in load_tenants(path).tenants] if path else None
    worker = make(
        list(tenants) or ["*"],
        connection=conn,
        store=store,
        key=key,
        max_job_bytes=limit,
        declared=declared,
        stop_grace=settings.get("stop_grace"),  # the chart sets these two, as for decodebench-worker
        heartbeat_file=settings.get("heartbeat_file"),
    )
    worker.work(burst=burst, max_jobs=max_jobs, logging_level=None)


COMMANDS = [report, report_worker]


def _dispatch(api: str | None, redis_url: str, store_url: str, tenant: str, wait_s: float):
    """`--distributed`: the cells, then the pairs, missing from the cache enqueued through the backend (the
    submission server with --api, else this process as the operator) and waited for in the store."""
    from controller.cli.backend import backend
    from controller.report.distribute.remote import ReportWorkers

    return ReportWorkers(backend(api, redis_url, store_url, tenant), stall_s=wait_s)


def _token_tenant(api: str) -> str:
    from controller.cli.backend import no_tenant_flag
    from controller.server.client import connect

    no_tenant_flag()
    with connect(api) as client:
        who = client.call("GET", "/v1/whoami")
    if not who.get("tenant"):
        raise UsageError(f"token {who.get('token_id')!r} acts for no tenant: it cannot read sweeps")
    return settings.tenant(who["tenant"])


def _dry_run(store, tenant: str, sweep: str) -> None:
    """`report --dry-run`: the judge's requests, cached and to send, and nothing else."""
    from controller.judge.report import judge_summary
    from controller.report.load.sweep import load_sweep

    data = load_sweep(store, tenant, store.resolve_sweep(tenant, sweep), with_generations=False)
    doc = judge_summary(store, tenant, data.sweep_id, data.sweep_spec, data.results, data.cell_order, 0, dry_run=True)
    click.echo(doc["plan"] if doc else "judge: the sweep has no judge; nothing to send")
