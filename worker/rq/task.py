"""The one function RQ calls for every decodebench job: `run_queued_job(job_dict)`.

It records the job's state transitions in the sweep (`worker.sweepstate`) around
`worker.engine.job.run_job`, the same function local mode calls. What the job runs with
(the worker's store, its pinned runtime) is lent by the worker process for the duration
of the job (`lend(...)`), as RQ lends the job itself through `get_current_job()`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import structlog

from worker import sweepstate
from worker.core import keys, rqadapter
from worker.core.contract import JobRef, JobSpec, JobStatus
from worker.core.engines import OWN_ENGINE, engine_name
from worker.core.errors import DecodebenchError, Interrupted, PermanentJobError, UsageError, short, shown
from worker.core.policy import Limits, job_refusal
from worker.rq import unavailable

log = structlog.get_logger("decodebench.task")


@dataclass
class Lent:
    """What a worker lends the job it runs: its store and runtime, and a flag that is set
    while the job's own code runs (the only time the worker may interrupt it)."""

    store: Any
    runtime: Any
    active: threading.Event = field(default_factory=threading.Event)
    tenant: str = ""  # the tenant of the queue the running job was taken from


_lent: ContextVar[Lent | None] = ContextVar("decodebench_lent", default=None)


@contextlib.contextmanager
def lend(lent: Lent) -> Iterator[Lent]:
    token = _lent.set(lent)
    try:
        yield lent
    finally:
        _lent.reset(token)


def _payload(job) -> dict | None:
    """The one JobSpec dict an RQ job's payload passes to decodebench's task, None for any
    other shape. Raises RQ's DeserializationError if the payload is not readable JSON."""
    args, kwargs = job.args, job.kwargs
    if job.instance is not None or kwargs or not isinstance(args, (list, tuple)) or len(args) != 1:
        return None
    return args[0] if isinstance(args[0], dict) else None


def job_ref(job) -> JobRef | None:
    """Where an RQ job's JobSpec payload sits in a sweep; None for another kind of job."""
    try:
        spec = _payload(job)
    except rqadapter.DeserializationError:  # not a decodebench job: RQ's own heartbeats still apply
        return None
    ids = [spec.get(k) for k in JobRef._fields] if spec else []
    return JobRef(*ids) if ids and all(isinstance(i, str) for i in ids) else None


def refusal(job, tenant: str, tenants, limits: Limits, engine: str = OWN_ENGINE) -> str | None:
    """Why a job taken from `tenant`'s queue must not run (its payload, signed, is still the tenant's
    word); `tenants` is the tenants file (None: a single team), `limits` the per-job caps, `engine` the
    one engine this worker runs (a job of another engine is never run here as something else)."""
    policy = tenants.get(tenant) if tenants is not None else None
    if tenants is not None and policy is None:
        return f"refused: tenant {tenant} is not declared in the tenants file"
    try:
        func, spec = job.func_name, _payload(job)
    except rqadapter.DeserializationError as err:  # RQ's own, for any payload its serializer cannot load
        cause = first_line(str(err.__cause__ or err)) or type(err.__cause__ or err).__name__
        return f"refused: the job's payload is not readable JSON ({shown(cause, 120)})"
    if func != keys.RQ_FUNCTION:
        return f"refused: the job calls {short(func)}, not {keys.RQ_FUNCTION}"
    if spec is None:
        return "refused: the job's arguments are not one JobSpec object"
    ref = job_ref(job)
    if ref is None:
        return "refused: the job's payload is not a decodebench job (tenant, sweep_id, job_id, cell: strings)"
    if ref.tenant != tenant:
        return f"refused: a job of tenant {short(ref.tenant)} on the queue of tenant {tenant!r}"
    try:
        job_spec = JobSpec.model_validate(spec)
    except ValueError:  # pydantic's ValidationError: run_queued_job fails it with the field's reason
        return None
    if (wanted := engine_name(job_spec.engine)) != engine:
        return f"refused: a job of engine {wanted} taken by a worker of engine {engine} (queue {short(job.origin)})"
    return job_refusal(job_spec, policy, limits)


def fail_unrunnable(rq_job, tenant: str, reason: str) -> bool:
    """Fail, for good, a job taken from `tenant`'s queue whose payload cannot be run: RQ keeps
    the reason in the job's meta, and the sweep that holds its RQ job id (found among the
    tenant's own sweeps, never by the payload's word) records it as failed with the reason.
    False if no sweep of the tenant knows the job (nothing to record there)."""
    rqadapter.fail_for_good(rq_job, reason)
    conn = rq_job.connection
    sweep_id = sweepstate.find_job_sweep(conn, tenant, rq_job.id)
    cell = conn.hget(keys.sweep(tenant, sweep_id, "cells"), rq_job.id) if sweep_id else None
    log.warning("job.unrunnable", job_id=rq_job.id, tenant=tenant, sweep_id=sweep_id, reason=reason)
    if cell is None:
        return False
    live = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED)  # never over a done or cancelled job
    sweepstate.transition(
        conn, tenant, sweep_id, rq_job.id, cell.decode(), JobStatus.FAILED, allowed=live, reason=reason
    )
    return True


def first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else ""


def classify(err: BaseException) -> tuple[bool, str]:
    """(permanent, reason): a permanent error fails the job at once, without retries."""
    from pydantic import ValidationError

    if isinstance(err, (PermanentJobError, UsageError)):
        return True, first_line(str(err)) or type(err).__name__
    if isinstance(err, ValidationError):
        e = err.errors()[0]
        where = shown(".".join(str(p) for p in e["loc"]), 80) or "job"  # the keys are the payload's
        return True, f"invalid job: {where}: {first_line(e['msg'])}"
    if rqadapter.is_timeout(err):
        return True, f"job timed out ({first_line(str(err))}); raise job_timeout_s in the sweep spec"
    if isinstance(err, DecodebenchError):
        return False, first_line(str(err)) or type(err).__name__
    return False, f"{type(err).__name__}: {first_line(str(err))}".rstrip(": ")


def _failed(rq_job, ref: JobRef, err: BaseException) -> None:
    """Record a failure: back to queued if RQ will retry it, else failed with its reason."""
    permanent, reason = classify(err)
    if permanent:
        rqadapter.fail_for_good(rq_job, reason)
        retry = False
    else:
        retry = rqadapter.note_failure(rq_job, reason)
    state = JobStatus.QUEUED if retry else JobStatus.FAILED
    sweepstate.transition(rq_job.connection, *ref, state, allowed=(JobStatus.RUNNING,), reason=reason)
    log.warning("job.failed", job_id=ref.job_id, reason=reason, retry=retry, permanent=permanent)


def run_queued_job(job: dict) -> dict[str, Any]:
    """Run one job for RQ (a JobSpec as a JSON dict) and keep the sweep's state."""
    from pydantic import ValidationError

    from worker.engine.job import run_job

    lent = _lent.get()
    if lent is None:
        raise PermanentJobError("run_queued_job runs inside decodebench-worker, which lends it a store and a device")
    rq_job = rqadapter.current_job()
    try:
        spec = JobSpec.model_validate(job)
    except ValidationError as err:  # the payload is the tenant's word: fail the job, not the worker
        reason = classify(err)[1]
        fail_unrunnable(rq_job, lent.tenant, reason)
        raise PermanentJobError(reason) from None
    conn = rq_job.connection
    ref = spec.ref
    startable = ("none", JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED)
    if sweepstate.is_cancelled(conn, ref.tenant, ref.sweep_id):  # however it came back to a queue: never started
        sweepstate.transition(conn, *ref, JobStatus.CANCELLED, allowed=(JobStatus.QUEUED, JobStatus.RUNNING))
        log.info("job.not_run", job_id=spec.job_id, state=JobStatus.CANCELLED.value, why="its sweep is cancelled")
        return {"job_id": spec.job_id, "status": JobStatus.CANCELLED.value}
    applied, old = sweepstate.transition(conn, *ref, JobStatus.RUNNING, allowed=startable)
    if not applied and old != JobStatus.RUNNING:
        log.info("job.not_run", job_id=spec.job_id, state=old)
        return {"job_id": spec.job_id, "status": "skipped" if old == JobStatus.DONE else old}
    try:
        lent.active.set()
        try:
            unavailable.before_job(conn, spec, lent.runtime)  # a model that cannot load fails once
            out = run_job(spec, store=lent.store, runtime=lent.runtime)
        finally:
            lent.active.clear()
    except Interrupted as err:
        state = JobStatus.QUEUED if err.why == "shutdown" else JobStatus.CANCELLED
        sweepstate.transition(conn, *ref, state, allowed=(JobStatus.RUNNING,))
        raise
    except BaseException as err:
        _failed(rq_job, ref, unavailable.after_failure(conn, spec, err))
        raise
    sweepstate.transition(
        conn, *ref, JobStatus.DONE, new_tokens=int(out.get("new_tokens", 0) or 0), generations=len(spec.prompts)
    )
    return out
