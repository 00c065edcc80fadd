"""Distributed-mode commands: submit, status, cancel, retry, logs, doctor.

Registered on the `decodebench` group by `controller.cli` (`for c in COMMANDS: main.add_command(c)`).
No torch at import time: `doctor` imports it inside its check.
"""

from __future__ import annotations

import json
import sys
import time

import click

from controller.settings import configured_store, setting
from worker.errors import UsageError

_redis_opt = click.option("--redis-url", default=None, help="Redis URL (env DECODEBENCH_REDIS_URL; default redis://127.0.0.1:6379/0).")
_store_opt = click.option("--store", default=None, help="Store: a directory, file:// or s3:// URL (env DECODEBENCH_STORE; default ./runs).")
_tenant_opt = click.option("--tenant", default=None, help="Tenant (env DECODEBENCH_TENANT; default 'default').")


def _conn(url: str | None):
    from controller.queue import connect

    return connect(setting("redis_url", url))




def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


@click.command()
@click.argument("spec_path", metavar="SPEC")
@_tenant_opt
@click.option("--priority", type=click.Choice(["high", "normal", "low"]), default="normal", show_default=True,
              help="Queue priority: workers take high before normal before low.")
@click.option("--retry-failed", is_flag=True, help="Also enqueue the sweep's failed and cancelled jobs again.")
@click.option("--retries", type=int, default=None, help="Retries of a transient failure (default: one per DECODEBENCH_RETRY_INTERVALS entry, 3).")
@click.option("--remote-paths", is_flag=True,
              help="Model paths live on the workers (e.g. a shared volume): resolve them but do not require them here.")
@_redis_opt
@_store_opt
def submit(spec_path: str, tenant: str | None, priority: str, retry_failed: bool, retries: int | None,
           remote_paths: bool, redis_url: str | None, store: str | None) -> None:
    """Plan a sweep and enqueue its jobs for workers (idempotent)."""
    from controller.queue import submit as do_submit
    from controller.spec import load_spec

    spec = load_spec(spec_path, check_paths=not remote_paths)
    tenant = setting("tenant", tenant)
    conn = _conn(redis_url)
    st = configured_store(store)
    out = do_submit(conn, st, spec, tenant, priority, retry_failed=retry_failed, retries=retries)
    if out.new:
        click.echo(f"sweep {out.sweep_id} submitted: {len(out.enqueued)} jobs on {out.queue}; store {st.url}")
    else:
        click.echo(f"sweep {out.sweep_id} already submitted: {out.done} done, {out.pending} queued or running, "
                   f"{out.failed} failed or cancelled; {len(out.enqueued)} jobs enqueued now")
        if out.cancelled and not retry_failed:
            click.echo("  the sweep was cancelled: pass --retry-failed to resume it", err=True)
        elif out.failed:
            click.echo("  pass --retry-failed (or `decodebench retry SWEEP --failed`) to run the failed jobs again")
    click.echo(f"follow it with: decodebench status {out.sweep_id} --watch")


def render_status(s) -> str:
    states = ("queued", "running", "done", "failed", "cancelled")
    width = max([len("cell"), *(len(c) for c in s.cells)])
    lines = [f"sweep {s.sweep_id} ({s.name}), tenant {s.tenant}, queue {s.queue}{'  [CANCELLED]' if s.cancelled else ''}"]
    done = s.total("done")
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
        "sweep_id": s.sweep_id, "name": s.name, "tenant": s.tenant, "queue": s.queue, "jobs": s.n_jobs,
        "cancelled": s.cancelled, "complete": s.complete, "cells": s.cells,
        "totals": {x: s.total(x) for x in ("queued", "running", "done", "failed", "cancelled")},
        "jobs_per_s": s.jobs_per_s, "tokens_per_s": s.tokens_per_s, "eta_s": s.eta_s,
        "failures": [{"job_id": j, "cell": c, "reason": r} for j, c, r in s.failures], "n_failures": s.n_failures,
        "lost": s.lost,
    }


@click.command()
@click.argument("sweep")
@_tenant_opt
@click.option("--watch", is_flag=True, help="Refresh until no job is queued or running.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_redis_opt
def status(sweep: str, tenant: str | None, watch: bool, interval: float, as_json: bool, redis_url: str | None) -> None:
    """Per-cell queued/running/done/failed, throughput, ETA and failure reasons."""
    from controller.queue import resolve_sweep, sweep_status

    tenant = setting("tenant", tenant)
    conn = _conn(redis_url)
    sweep_id = resolve_sweep(conn, tenant, sweep)
    while True:
        s = sweep_status(conn, tenant, sweep_id)
        click.echo(json.dumps(status_dict(s)) if as_json else render_status(s))
        if not watch or s.complete:
            break
        time.sleep(interval)
        if not as_json:
            click.echo("")
    if watch and (s.total("failed") or s.total("cancelled")):
        sys.exit(1)


@click.command()
@click.argument("sweep")
@_tenant_opt
@_redis_opt
def cancel(sweep: str, tenant: str | None, redis_url: str | None) -> None:
    """Cancel a sweep: drop its queued jobs, ask its running jobs to stop."""
    from controller.queue import cancel as do_cancel
    from controller.queue import resolve_sweep

    tenant = setting("tenant", tenant)
    conn = _conn(redis_url)
    sweep_id = resolve_sweep(conn, tenant, sweep)
    out = do_cancel(conn, tenant, sweep_id)
    click.echo(f"sweep {sweep_id} cancelled: {out.cancelled} queued jobs dropped, {len(out.stopping)} running jobs asked to stop; "
               f"resume with `decodebench retry {sweep_id} --failed`")


@click.command()
@click.argument("sweep")
@click.option("--failed", is_flag=True, help="Retry the failed and cancelled jobs (the default and only mode).")
@_tenant_opt
@click.option("--priority", type=click.Choice(["high", "normal", "low"]), default="normal", show_default=True)
@_redis_opt
@_store_opt
def retry(sweep: str, failed: bool, tenant: str | None, priority: str, redis_url: str | None, store: str | None) -> None:
    """Enqueue a sweep's failed (and cancelled) jobs again."""
    from controller.queue import resolve_sweep
    from controller.queue import retry as do_retry

    tenant = setting("tenant", tenant)
    conn = _conn(redis_url)
    sweep_id = resolve_sweep(conn, tenant, sweep)
    out = do_retry(conn, configured_store(store), tenant, sweep_id, priority)
    click.echo(f"sweep {sweep_id}: {len(out.enqueued)} failed or cancelled jobs enqueued again on {out.queue}; "
               f"{out.done} done, {out.pending} queued or running")


def format_log_line(row: dict) -> str:
    skip = {"timestamp", "level", "event", "tenant", "sweep_id", "job_id", "model", "strategy"}
    extra = " ".join(f"{k}={v}" for k, v in row.items() if k not in skip)
    return f"{row.get('timestamp', '')} {row.get('level', ''):<7} {row.get('event', '')} {extra}".rstrip()


@click.command()
@click.argument("job")
@click.option("--sweep", default=None, help="The job's sweep (default: looked up in Redis).")
@_tenant_opt
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON lines.")
@_redis_opt
@_store_opt
def logs(job: str, sweep: str | None, tenant: str | None, as_json: bool, redis_url: str | None, store: str | None) -> None:
    """Print a job's structured log (from the store)."""
    from worker import paths

    tenant = setting("tenant", tenant)
    st = configured_store(store)
    state = None
    if sweep is None:
        from controller.queue import job_state, job_sweep

        conn = _conn(redis_url)
        sweep = job_sweep(conn, tenant, job)
        if sweep is None:
            raise UsageError(f"job {job!r} is not in any submitted sweep of tenant {tenant!r}; give --sweep")
        state = job_state(conn, tenant, sweep, job)
    key = paths.log_key(tenant, sweep, job)
    if not st.exists(key):
        raise UsageError(f"job {job} of sweep {sweep} has no log in {st.url} yet" + (f" (state: {state})" if state else ""))
    for row in st.read_jsonl(key):
        click.echo(json.dumps(row, sort_keys=True) if as_json else format_log_line(row))


# -- doctor ---------------------------------------------------------------------------------

PASS, FAIL, NOTE = "PASS", "FAIL", "NOTE"


def check_torch(require_gpu: bool) -> list[tuple[str, str, str]]:
    """torch and CUDA: a missing torch is a note (controller-only install), not a failure."""
    import os

    try:
        import torch
    except ImportError:
        return [(NOTE, "torch", "not installed (a controller-only install); workers need `pip install decodebench[worker]`")]
    out = [(PASS, "torch", f"torch {torch.__version__}")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    if not torch.cuda.is_available():
        out.append((FAIL if require_gpu else NOTE, "cuda", f"CUDA not available{where}: workers run with --device cpu only"))
        return out
    count = torch.cuda.device_count()
    out.append((PASS, "cuda", f"CUDA {torch.version.cuda}, {count} device(s){where}"))
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        uuid = f"GPU-{props.uuid}" if getattr(props, "uuid", None) else "?"
        try:
            free, total = torch.cuda.mem_get_info(i)
            mem = f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB"
        except Exception as err:  # a busy or broken device
            mem = f"free memory unknown ({type(err).__name__})"
        out.append((PASS, f"cuda:{i}", f"{props.name} ({uuid}): {mem}"))
    return out


def check_nvml(require_gpu: bool) -> list[tuple[str, str, str]]:
    """NVML (nvidia-ml-py): GPU telemetry. Missing is a note unless --require-gpu."""
    level = FAIL if require_gpu else NOTE
    try:
        import pynvml
    except ImportError:
        return [(level, "nvml", "nvidia-ml-py not installed: no GPU memory/utilisation telemetry")]
    try:
        pynvml.nvmlInit()
    except Exception as err:
        return [(level, "nvml", f"NVML unavailable ({type(err).__name__}: {err}): no GPU telemetry")]
    driver = pynvml.nvmlSystemGetDriverVersion()
    count = pynvml.nvmlDeviceGetCount()
    out = [(PASS, "nvml", f"driver {driver.decode() if isinstance(driver, bytes) else driver}, {count} GPU(s)")]
    for i in range(count):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        name, uuid = pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
        out.append((PASS, f"gpu {i}", f"{text(name)} ({text(uuid)}): {mem.free / 2**30:.1f} GiB free of {mem.total / 2**30:.1f} GiB"))
    return out


def check_redis(url: str, tenant: str) -> tuple[str, str, str]:
    from controller.queue import connect
    from worker import keys
    from worker.cli import _safe_url
    from worker.errors import DecodebenchError

    try:
        conn = connect(url)
        key = keys.doctor(tenant)
        conn.set(key, "ok", ex=60)
        if conn.get(key) != b"ok":
            return FAIL, "redis", f"{_safe_url(url)}: read back differs from what was written"
        conn.delete(key)
        version = conn.info("server").get("redis_version", "?")
    except DecodebenchError as err:
        return FAIL, "redis", str(err)
    except Exception as err:
        return FAIL, "redis", f"{_safe_url(url)}: {type(err).__name__}: {err}".splitlines()[0]
    return PASS, "redis", f"{_safe_url(url)} reachable and writable (Redis {version})"


def check_store(url: str) -> tuple[str, str, str]:
    from worker.store import open_store

    try:
        store = open_store(url)
        store.check()
    except Exception as err:
        return FAIL, "store", f"{url}: {type(err).__name__}: {err}".splitlines()[0]
    return PASS, "store", f"{store.url} reachable and writable"


@click.command()
@_tenant_opt
@click.option("--require-gpu", is_flag=True, help="Fail when CUDA or NVML is not available (on GPU workers).")
@click.option("--local", is_flag=True, help="Local mode only: Redis is not required.")
@_redis_opt
@_store_opt
def doctor(tenant: str | None, require_gpu: bool, local: bool, redis_url: str | None, store: str | None) -> None:
    """Check torch/CUDA, NVML, GPUs and their free memory, Redis and the store."""
    tenant = setting("tenant", tenant)
    results = [*check_torch(require_gpu), *check_nvml(require_gpu)]
    redis_check = check_redis(setting("redis_url", redis_url), tenant)
    if local and redis_check[0] == FAIL:
        redis_check = (NOTE, "redis", redis_check[2] + " (not needed with --local)")
    results += [redis_check, check_store(setting("store", store))]
    width = max(len(name) for _, name, _ in results)
    for level, name, detail in results:
        click.echo(f"{level}  {name:<{width}}  {detail}")
    failed = [name for level, name, _ in results if level == FAIL]
    click.echo(f"{len(failed)} check(s) failed: {', '.join(failed)}" if failed else "all required checks passed")
    if failed:
        sys.exit(1)


COMMANDS = [submit, status, cancel, retry, logs, doctor]
