"""Distributed-mode commands: submit, status, cancel, retry, logs.

Submitting is `controller.launch.submit`; status and cancel read and write the sweep's
state through `worker.sweepstate`.
"""

from __future__ import annotations

import json
import sys
import time

import click

from controller.cli import options
from worker.core.contract import JobStatus
from worker.core.errors import UsageError

STATES = tuple(s.value for s in JobStatus)


def _conn(url: str, tenant: str | None = None):
    """Redis for `tenant`; a URL whose user is another tenant is refused here, in one line
    (and Redis would refuse that user another tenant's keys anyway: docs/tenants.md)."""
    from worker.core.redisconn import connect, redis_user

    user = redis_user(url)
    if tenant is not None and user not in (None, "default", "worker", tenant):
        raise UsageError(f"connected to Redis as tenant {user!r}: it may not act on the sweeps of tenant {tenant!r}")
    return connect(url)


def audit(action: str, tenant: str, sweep_id: str, redis_url: str, **fields) -> None:
    """One audit line per submit, cancel and retry: who (Redis user, else OS user), which tenant and sweep."""
    import getpass

    import structlog

    from worker.core.redisconn import redis_user

    user = redis_user(redis_url) or f"os:{getpass.getuser()}"
    structlog.get_logger("decodebench.audit").info(
        "audit", action=action, tenant=tenant, user=user, sweep_id=sweep_id, **fields
    )


def _store(url: str):
    from worker.store import open_store

    return open_store(url)


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
    type=int,
    default=None,
    help="Retries of a transient failure (default: one per DECODEBENCH_RETRY_INTERVALS entry, 3).",
)
@click.option(
    "--remote-paths",
    is_flag=True,
    help="Model paths live on the workers (e.g. a shared volume): resolve them but do not require them here.",
)
@options.redis_url
@options.store
def submit(
    spec_path: str,
    tenant: str,
    priority: str,
    retry_failed: bool,
    retries: int | None,
    remote_paths: bool,
    redis_url: str,
    store: str,
) -> None:
    """Plan a sweep and enqueue its jobs for workers (idempotent)."""
    from controller.launch.submit import submit as do_submit
    from controller.spec.load import load_spec
    from worker.core import settings, signing

    spec = load_spec(spec_path, check_paths=not remote_paths)
    key = signing.load_key(settings.get("signing_key_file"))  # the operator's path: the server signs otherwise
    conn = _conn(redis_url, tenant)
    st = _store(store)
    out = do_submit(conn, st, spec, tenant, priority, key=key, retry_failed=retry_failed, retries=retries)
    if out.new:
        click.echo(f"sweep {out.sweep_id} submitted: {len(out.enqueued)} jobs on {out.queue}; store {st.url}")
    else:
        click.echo(
            f"sweep {out.sweep_id} already submitted: {out.done} done, {out.pending} queued or running, "
            f"{out.failed} failed or cancelled; {len(out.enqueued)} jobs enqueued now"
        )
        if out.cancelled and not retry_failed:
            click.echo("  the sweep was cancelled: pass --retry-failed to resume it", err=True)
        elif out.failed:
            click.echo("  pass --retry-failed (or `decodebench retry SWEEP --failed`) to run the failed jobs again")
    click.echo(f"follow it with: decodebench status {out.sweep_id} --watch")
    audit("submit", tenant, out.sweep_id, redis_url, enqueued=len(out.enqueued), queue=out.queue)


def render_status(s) -> str:
    states = STATES
    width = max([len("cell"), *(len(c) for c in s.cells)])
    lines = [
        f"sweep {s.sweep_id} ({s.name}), tenant {s.tenant}, queue {s.queue}{'  [CANCELLED]' if s.cancelled else ''}"
    ]
    done = s.total(JobStatus.DONE)
    lines.append(f"{done}/{s.n_jobs} jobs done, " + ", ".join(f"{s.total(x)} {x}" for x in states if x != "done"))
    lines.append(f"  {'cell':<{width}}  " + "  ".join(f"{x:>9}" for x in states))
    for cell, counts in s.cells.items():
        lines.append(f"  {cell:<{width}}  " + "  ".join(f"{counts.get(x, 0):>9}" for x in states))
    rate, tps = s.jobs_per_s, s.tokens_per_s
    speed = f"{rate * 60:.1f} jobs/min" if rate else "no job finished yet"
    if tps:
        speed += f", {tps:,.0f} tokens/s"
    eta = "complete" if s.complete else f"ETA {_duration(s.eta_s)}"
    lines.append(f"throughput: {speed}; {eta}")
    if s.lost:
        lines.append(f"{s.lost} job run(s) lost with their worker and requeued")
    if s.n_failures:
        lines.append(f"failures ({len(s.failures)} of {s.n_failures} shown):")
        for job_id, cell, reason in s.failures:
            lines.append(f"  {job_id}  {cell}: {reason}")
    return "\n".join(lines)


def status_dict(s) -> dict:
    return {
        "sweep_id": s.sweep_id,
        "name": s.name,
        "tenant": s.tenant,
        "queue": s.queue,
        "jobs": s.n_jobs,
        "cancelled": s.cancelled,
        "complete": s.complete,
        "cells": s.cells,
        "totals": {x: s.total(x) for x in STATES},
        "jobs_per_s": s.jobs_per_s,
        "tokens_per_s": s.tokens_per_s,
        "eta_s": s.eta_s,
        "failures": [{"job_id": j, "cell": c, "reason": r} for j, c, r in s.failures],
        "n_failures": s.n_failures,
        "lost": s.lost,
        "problems": s.problems,
    }


def render_tenants(rows) -> str:
    total = sum(r.worker_s for r in rows)
    lines = [f"{'tenant':<20} {'queued':>8} {'running':>8} {'done':>8} {'share (1h)':>11}"]
    for r in rows:
        share = f"{100 * r.worker_s / total:.1f}%" if total else "-"
        lines.append(f"{r.tenant:<20} {r.queued:>8} {r.running:>8} {r.done:>8} {share:>11}")
    return "\n".join(lines)


def _all_tenants(redis_url: str, as_json: bool) -> None:
    from dataclasses import asdict

    from worker.sweepstate.reads import known_tenants, tenant_overview

    conn = _conn(redis_url)
    rows = [tenant_overview(conn, t) for t in known_tenants(conn)]
    click.echo(json.dumps([asdict(r) for r in rows]) if as_json else render_tenants(rows))


@click.command()
@click.argument("sweep", required=False)
@options.tenant
@click.option("--all-tenants", is_flag=True, help="Per tenant: queued, running, done, share of worker time (1 h).")
@click.option("--watch", is_flag=True, help="Refresh until no job is queued or running.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@options.redis_url
def status(
    sweep: str | None, tenant: str, all_tenants: bool, watch: bool, interval: float, as_json: bool, redis_url: str
) -> None:
    """Per-cell queued/running/done/failed, throughput, ETA and failure reasons."""
    from worker.sweepstate import read_status, resolve_sweep

    if all_tenants:
        return _all_tenants(redis_url, as_json)  # the workers' (admin) Redis user: it reads every tenant
    if not sweep:
        raise UsageError("status: give a SWEEP (or --all-tenants)")
    conn = _conn(redis_url, tenant)
    sweep_id = resolve_sweep(conn, tenant, sweep)
    while True:
        s = read_status(conn, tenant, sweep_id)
        for problem in s.problems:  # a damaged value in Redis: named, left out, the rest shown
            click.echo(f"warning: {problem}", err=True)
        click.echo(json.dumps(status_dict(s)) if as_json else render_status(s))
        if not watch or s.complete:
            break
        time.sleep(interval)
        if not as_json:
            click.echo("")
    if watch and (s.total(JobStatus.FAILED) or s.total(JobStatus.CANCELLED)):
        sys.exit(1)


@click.command()
@click.argument("sweep")
@options.tenant
@options.redis_url
def cancel(sweep: str, tenant: str, redis_url: str) -> None:
    """Cancel a sweep: drop its queued jobs, ask its running jobs to stop."""
    from worker.sweepstate import cancel_sweep, resolve_sweep

    conn = _conn(redis_url, tenant)
    sweep_id = resolve_sweep(conn, tenant, sweep)
    out = cancel_sweep(conn, tenant, sweep_id)
    audit("cancel", tenant, sweep_id, redis_url, dropped=out.cancelled, stopping=len(out.stopping))
    click.echo(
        f"sweep {sweep_id} cancelled: {out.cancelled} queued jobs dropped, "
        f"{len(out.stopping)} running jobs asked to stop; "
        f"resume with `decodebench retry {sweep_id} --failed`"
    )


@click.command()
@click.argument("sweep")
@click.option("--failed", is_flag=True, help="Retry the failed and cancelled jobs (the default and only mode).")
@options.tenant
@options.priority
@options.redis_url
@options.store
def retry(sweep: str, failed: bool, tenant: str, priority: str, redis_url: str, store: str) -> None:
    """Enqueue a sweep's failed (and cancelled) jobs again."""
    from controller.launch.submit import retry as do_retry
    from worker.core import settings, signing
    from worker.sweepstate import resolve_sweep

    key = signing.load_key(settings.get("signing_key_file"))
    conn = _conn(redis_url, tenant)
    sweep_id = resolve_sweep(conn, tenant, sweep)
    out = do_retry(conn, _store(store), tenant, sweep_id, priority, key=key)
    audit("retry", tenant, sweep_id, redis_url, enqueued=len(out.enqueued))
    click.echo(
        f"sweep {sweep_id}: {len(out.enqueued)} failed or cancelled jobs enqueued again on {out.queue}; "
        f"{out.done} done, {out.pending} queued or running"
    )


def format_log_line(row: dict) -> str:
    skip = {"timestamp", "level", "event", "tenant", "sweep_id", "job_id", "model", "strategy"}
    extra = " ".join(f"{k}={v}" for k, v in row.items() if k not in skip)
    return f"{row.get('timestamp', '')} {row.get('level', ''):<7} {row.get('event', '')} {extra}".rstrip()


@click.command()
@click.argument("job")
@click.option("--sweep", default=None, help="The job's sweep (default: looked up in Redis).")
@options.tenant
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON lines.")
@options.redis_url
@options.store
def logs(job: str, sweep: str | None, tenant: str, as_json: bool, redis_url: str, store: str) -> None:
    """Print a job's structured log (from the store)."""
    from worker.core import paths
    from worker.sweepstate import find_job_sweep, job_state

    st = _store(store)
    state = None
    if sweep is None:
        conn = _conn(redis_url, tenant)
        sweep = find_job_sweep(conn, tenant, job)
        if sweep is None:
            raise UsageError(f"job {job!r} is not in any submitted sweep of tenant {tenant!r}; give --sweep")
        state = job_state(conn, tenant, sweep, job)
    key = paths.log_key(tenant, sweep, job)
    if not st.exists(key):
        raise UsageError(
            f"job {job} of sweep {sweep} has no log in {st.url} yet" + (f" (state: {state})" if state else "")
        )
    for row in st.read_jsonl(key):
        click.echo(json.dumps(row, sort_keys=True) if as_json else format_log_line(row))


COMMANDS = [submit, status, cancel, retry, logs]
