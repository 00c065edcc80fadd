"""Distributed-mode commands: submit, status, cancel, retry, failures, logs.

With `--api URL` (DECODEBENCH_API_URL) a command goes through the submission server, as a
tenant's token (the tenant comes from the token); that is how teams work on a shared
cluster (docs/tenants.md). Without it, the command talks to Redis directly: the operator's
path (the server's own Redis user) and a single machine's. Both paths print the same
answers: the rendering below takes the JSON the server answers with.
"""

from __future__ import annotations

import json
import sys
import time

import click

from controller.cli import options
from controller.cli.backend import backend
from controller.sweep.wording import plural
from worker.core import settings
from worker.core.contract import JobStatus
from worker.core.errors import UsageError
from worker.core.safetext import terminal, terminal_lines

STATES = tuple(s.value for s in JobStatus)
MIN_INTERVAL_S = 0.5  # status --watch: 0 asked the server (or Redis) without a pause, a negative one crashed


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


@click.command()
@click.argument("spec_path", metavar="SPEC")
@options.tenant
@options.priority
@click.option("--retry-failed", is_flag=True, help="Also enqueue the sweep's failed and cancelled jobs again.")
@click.option(
    "--retries",
    type=click.IntRange(0, 10),
    default=None,
    help="Retries of a transient failure (default: one per DECODEBENCH_RETRY_INTERVALS entry, 3).",
)
@click.option(
    "--remote-paths",
    is_flag=True,
    help="Model paths live on the workers (e.g. a shared volume): resolve them but do not require them here.",
)
@options.api
@options.redis_url
@options.store
def submit(
    spec_path: str,
    tenant: str,
    priority: str,
    retry_failed: bool,
    retries: int | None,
    remote_paths: bool,
    api: str | None,
    redis_url: str,
    store: str,
) -> None:
    """Plan a sweep and enqueue its jobs for workers (idempotent)."""
    from controller.cli.local import repeated_notes
    from controller.server.client import submission
    from controller.sweep.load import load_spec

    spec = load_spec(spec_path, check_paths=not remote_paths)
    repeated_notes(spec)
    to = backend(api, redis_url, store, tenant)
    body = submission(spec, priority, retry_failed, retries)
    out = to.submit(body)
    n = out["enqueued"]
    if out["new"]:
        click.echo(f"sweep {out['sweep_id']} submitted: {n} {plural(n, 'job')} on {out['queue']}; {to.where}")
    else:
        click.echo(
            f"sweep {out['sweep_id']} already submitted: {out['done']} done, {out['pending']} queued or running, "
            f"{out['failed']} failed or cancelled; {n} {plural(n, 'job')} enqueued now"
        )
        if out["cancelled"] and not retry_failed:
            click.echo("  the sweep was cancelled: pass --retry-failed to resume it", err=True)
        elif out["failed"]:
            click.echo("  pass --retry-failed (or `decodebench retry SWEEP --failed`) to run the failed jobs again")
    click.echo(f"follow it with: decodebench status {out['sweep_id']} --watch")
    to.audit("submit", out)


def render_status(s: dict, width: int | None = None, height: int | None = None) -> str:
    """The status answer (`controller.server.service.status_dict`) as the terminal shows it: the sweep, its
    totals and its throughput and ETA first (always in view), then a row per cell, each label cut to fit
    `width` and the rows to fit `height` (the rest counted on one line), then the failures."""
    totals = s["totals"]
    head = [
        f"sweep {s['sweep_id']} ({terminal(s['name'])}), tenant {s['tenant']}, queue {s['queue']}"
        + ("  [CANCELLED]" if s["cancelled"] else ""),
        f"{totals['done']}/{s['jobs']} {plural(s['jobs'], 'job')} done, "
        + ", ".join(f"{totals[x]} {x}" for x in STATES if x != "done"),
        f"throughput: {_speed(s)}; {_ending(s)}",
    ]
    if s.get("stale"):
        head.append(
            f"{s['stale']} running {plural(s['stale'], 'job')} without a recent heartbeat: "
            "the worker may be gone (requeued once its heartbeat TTL has passed)"
        )
    if s["lost"]:
        head.append(f"{s['lost']} job run(s) lost with their worker and requeued")
    tail = []
    if s["n_failures"]:
        tail.append(f"failures ({len(s['failures'])} of {s['n_failures']} shown):")
        tail += failure_lines(s)
    rows = _cell_rows(s["cells"], width, None if height is None else max(2, height - len(head) - len(tail) - 1))
    return "\n".join(_cut(line, width) for line in head + rows + tail)


def _speed(s: dict) -> str:
    rate, tps = s["jobs_per_s"], s["tokens_per_s"]
    speed = f"{rate * 60:.1f} jobs/min" if rate else "no job finished yet"
    return speed + (f", {tps:,.0f} tokens/s" if tps else "")


def _ending(s: dict) -> str:
    """`ETA 3m05s` while jobs are queued or running; once none is: `complete`, or `failed: ...` (never
    `complete` for a sweep whose jobs failed or were cancelled)."""
    if not s["complete"]:
        return f"ETA {_duration(s['eta_s'])}"
    failed, cancelled = s["totals"]["failed"], s["totals"]["cancelled"]
    if not failed and not cancelled:
        return "complete"
    parts = [f"{n} {plural(n, 'job')} {x}" for x, n in (("failed", failed), ("cancelled", cancelled)) if n]
    retry = f"decodebench retry {s['sweep_id']} --failed"
    return ("failed: " if failed else "ended: ") + ", ".join(parts) + f" ({retry} runs them again)"


def _cut(text: str, width: int | None, keep_end: bool = False) -> str:
    if width is None or len(text) <= width:
        return text
    if keep_end:  # a cell's label: its end (the variant's parameters) tells cells apart
        half = (width - 1) // 2
        return text[:half] + "…" + text[len(text) - (width - 1 - half) :]
    return text[: width - 1] + "…"


def _cell_rows(cells: dict, width: int | None, height: int | None) -> list[str]:
    """The per-cell table: `model · variant` labels cut to leave the counts room, at most `height` lines."""
    from controller.sweep.labels import key_labels  # the report's labels, from the cell keys

    labels = {terminal(c): counts for c, counts in zip(key_labels(list(cells)), cells.values())}  # user input
    counts_width = sum(len(x) + 2 for x in STATES)
    room = max(12, (width or 10**6) - counts_width - 2)
    label_w = min(room, max([len("cell"), *(len(c) for c in labels)]))
    lines = [f"  {'cell':<{label_w}}" + "".join(f"  {x:>{len(x)}}" for x in STATES)]
    items = list(labels.items())
    shown = items if height is None or len(items) + 1 <= height else items[: max(0, height - 2)]
    for label, counts in shown:
        numbers = "".join(f"  {counts.get(x, 0):>{len(x)}}" for x in STATES)
        lines.append(f"  {_cut(label, label_w, keep_end=True):<{label_w}}{numbers}")
    if len(shown) < len(items):
        rest = items[len(shown) :]
        done = sum(c.get("done", 0) for _, c in rest)
        lines.append(f"  … {len(rest)} more {plural(len(rest), 'cell')} ({done} jobs done); --json lists every cell")
    return lines


def failure_lines(out: dict) -> list[str]:
    """The failures of a status or failures answer: each model that cannot load once, with the number of jobs
    it failed; then every other failure, one per job."""
    marked = out.get("unavailable") or []
    lines = [
        f"  model {terminal(u['model'])} cannot load, {u['jobs']} {plural(u['jobs'], 'job')} failed:"
        f" {terminal(u['reason'])}"
        for u in marked
    ]
    reasons = {u["reason"] for u in marked}
    for f in out["failures"]:
        if f["reason"] not in reasons:
            lines.append(f"  {terminal(f['job_id'])}  {terminal(f['cell'])}: {terminal(f['reason'])}")
    return lines


def watch_live(to, sweep: str, interval: float) -> None:
    """status --watch at a terminal: one block redrawn in place (rich Live) until nothing is queued
    or running; exit 1 if a job failed or was cancelled."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console(highlight=False)
    with Live(console=console, auto_refresh=False) as live:
        while True:
            s = to.status(sweep)
            problems = "".join(f"\nwarning: {terminal(p)}" for p in s["problems"])
            width, height = console.size
            text = render_status(s, width, height - 1 - len(s["problems"])) + problems
            live.update(Text(text, no_wrap=True, overflow="ellipsis"), refresh=True)
            if s["complete"]:
                break
            time.sleep(interval)
    if s["totals"][JobStatus.FAILED.value] or s["totals"][JobStatus.CANCELLED.value]:
        sys.exit(1)


def render_tenants(rows: list[dict]) -> str:
    total = sum(r["worker_s"] for r in rows)
    lines = [f"{'tenant':<20} {'queued':>8} {'running':>8} {'done':>8} {'share (1h)':>11}"]
    for r in rows:
        share = f"{100 * r['worker_s'] / total:.1f}%" if total else "-"
        lines.append(f"{terminal(r['tenant']):<20} {r['queued']:>8} {r['running']:>8} {r['done']:>8} {share:>11}")
    return "\n".join(lines)


@click.command()
@click.argument("sweep", required=False)
@options.tenant
@click.option("--all-tenants", is_flag=True, help="Per tenant: queued, running, done, share of worker time (1 h).")
@click.option("--watch", is_flag=True, help="Refresh until no job is queued or running.")
@click.option(
    "--interval",
    type=settings.finite_float(MIN_INTERVAL_S),
    default=2.0,
    show_default=True,
    help=f"Seconds between refreshes with --watch (at least {MIN_INTERVAL_S:g}: each is a request to the server).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@options.api
@options.redis_url
def status(
    sweep: str | None,
    tenant: str,
    all_tenants: bool,
    watch: bool,
    interval: float,
    as_json: bool,
    api: str | None,
    redis_url: str,
) -> None:
    """Per-cell queued/running/done/failed, throughput, ETA and failure reasons."""
    to = backend(api, redis_url, "", tenant)
    if all_tenants:  # an admin token (or the operator's Redis user) reads every tenant
        rows = to.tenants()
        click.echo(json.dumps(rows) if as_json else render_tenants(rows))
        return
    if not sweep:
        raise UsageError("status: give a SWEEP (or --all-tenants)")
    if watch and not as_json and click.get_text_stream("stdout").isatty():
        return watch_live(to, sweep, interval)
    while True:
        s = to.status(sweep)
        for problem in s["problems"]:  # a damaged value in Redis: named, left out, the rest shown
            click.echo(f"warning: {terminal(problem)}", err=True)
        click.echo(json.dumps(s) if as_json else render_status(s))
        if not watch or s["complete"]:
            break
        time.sleep(interval)
        if not as_json:
            click.echo("")
    ended_badly = s["totals"][JobStatus.FAILED.value] or s["totals"][JobStatus.CANCELLED.value]
    if ended_badly and (watch or s["complete"]):  # a sweep that ended with failed jobs did not succeed
        sys.exit(1)


@click.command()
@click.argument("sweep")
@options.tenant
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@options.api
@options.redis_url
def failures(sweep: str, tenant: str, as_json: bool, api: str | None, redis_url: str) -> None:
    """Every failed job of a sweep with its one-line reason."""
    out = backend(api, redis_url, "", tenant).failures(sweep)
    if as_json:
        click.echo(json.dumps(out))
        return
    click.echo(f"sweep {out['sweep_id']}: {out['n_failures']} failed {plural(out['n_failures'], 'job')}")
    for line in failure_lines(out):
        click.echo(line)


@click.command()
@click.argument("sweep")
@options.tenant
@options.api
@options.redis_url
def cancel(sweep: str, tenant: str, api: str | None, redis_url: str) -> None:
    """Cancel a sweep: drop its queued jobs, ask its running jobs to stop."""
    to = backend(api, redis_url, "", tenant)
    out = to.cancel(sweep)
    sweep_id = out["sweep_id"]
    if out.get("idle"):  # (a server before it answered no `idle`)
        click.echo(f"sweep {sweep_id}: nothing queued or running, nothing to cancel")
    else:
        click.echo(
            f"sweep {sweep_id} cancelled: {out['dropped']} queued jobs dropped, "
            f"{out['stopping']} running jobs asked to stop; "
            f"resume with `decodebench retry {sweep_id} --failed`"
        )
    to.audit("cancel", out)


@click.command()
@click.argument("sweep")
@click.option("--failed", is_flag=True, help="Retry the failed and cancelled jobs (the default and only mode).")
@options.tenant
@options.priority
@options.api
@options.redis_url
@options.store
def retry(sweep: str, failed: bool, tenant: str, priority: str, api: str | None, redis_url: str, store: str) -> None:
    """Enqueue a sweep's failed (and cancelled) jobs again."""
    to = backend(api, redis_url, store, tenant)
    out = to.retry(sweep, priority)
    click.echo(
        f"sweep {out['sweep_id']}: {out['enqueued']} failed or cancelled jobs enqueued again on {out['queue']}; "
        f"{out['done']} done, {out['pending']} queued or running"
    )
    to.audit("retry", out)


def format_log_line(row: dict) -> str:
    """One line a row; a traceback (`exception`, a job's crash) follows it on lines of its own."""
    skip = {"timestamp", "level", "event", "tenant", "sweep_id", "job_id", "model", "strategy", "exception"}
    extra = " ".join(f"{k}={v}" for k, v in row.items() if k not in skip)
    line = terminal(f"{row.get('timestamp', '')} {row.get('level', ''):<7} {row.get('event', '')} {extra}".rstrip())
    trace = row.get("exception")
    return f"{line}\n{terminal_lines(trace.rstrip())}" if isinstance(trace, str) and trace.strip() else line


@click.command()
@click.argument("job")
@click.option("--sweep", default=None, help="The job's sweep (default: looked up among the tenant's sweeps).")
@options.tenant
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON lines.")
@options.api
@options.redis_url
@options.store
def logs(job: str, sweep: str | None, tenant: str, as_json: bool, api: str | None, redis_url: str, store: str) -> None:
    """Print a job's structured log (from the store)."""
    for row in backend(api, redis_url, store, tenant).job_log(sweep, job):
        click.echo(json.dumps(row, sort_keys=True) if as_json else format_log_line(row))


COMMANDS = [submit, status, failures, cancel, retry, logs]
