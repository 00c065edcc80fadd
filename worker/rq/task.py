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
from worker.core import keys
from worker.core.contract import JobSpec, JobStatus
from worker.core.errors import DecodebenchError, PermanentJobError, UsageError

log = structlog.get_logger("decodebench.task")


class Interrupted(BaseException):
    """Raised inside a running job by its worker (not by the job): shutdown or cancel.

    A BaseException so that no `except Exception` in the job swallows it.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why  # "shutdown": requeue the job; "cancel": the sweep was cancelled


@dataclass
class Lent:
    """What a worker lends the job it runs: its store and runtime, and a flag that is set
    while the job's own code runs (the only time the worker may interrupt it)."""

    store: Any
    runtime: Any
    active: threading.Event = field(default_factory=threading.Event)


_lent: ContextVar[Lent | None] = ContextVar("decodebench_lent", default=None)


@contextlib.contextmanager
def lend(lent: Lent) -> Iterator[Lent]:
    token = _lent.set(lent)
    try:
        yield lent
    finally:
        _lent.reset(token)


def job_ids(job) -> tuple[str, str, str, str] | None:
    """(tenant, sweep id, job id, cell) of an RQ job's JobSpec payload; None for another kind of job."""
    try:
        spec = job.args[0]
        return spec["tenant"], spec["sweep_id"], spec["job_id"], spec["cell"]
    except Exception:  # not a decodebench job: RQ's own heartbeats still apply
        return None


def refusal(job, tenant: str, policy) -> str | None:
    """Why a job taken from `tenant`'s queue must not run (its payload is the tenant's word);
    `policy` is the tenant's entry of the tenants file, or None."""
    if job.func_name != keys.RQ_FUNCTION:
        return f"refused: the job calls {job.func_name!r}, not {keys.RQ_FUNCTION}"
    ids = job_ids(job)
    if ids is None or ids[0] != tenant:
        return f"refused: a job of tenant {ids[0] if ids else '?'!r} on the queue of tenant {tenant!r}"
    model = (job.args[0].get("model") or {}).get("path")
    if policy and policy.models is not None and model not in policy.models:
        return f"refused: model {model!r} is not among tenant {tenant}'s models"
    return None


def first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else ""


def classify(err: BaseException) -> tuple[bool, str]:
    """(permanent, reason): a permanent error fails the job at once, without retries."""
    from pydantic import ValidationError
    from rq.timeouts import JobTimeoutException

    if isinstance(err, (PermanentJobError, UsageError)):
        return True, first_line(str(err)) or type(err).__name__
    if isinstance(err, ValidationError):
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"]) or "job"
        return True, f"invalid job: {where}: {e['msg']}"
    if isinstance(err, JobTimeoutException):
        return True, f"job timed out ({first_line(str(err))}); raise job_timeout_s in the sweep spec"
    if isinstance(err, DecodebenchError):
        return False, first_line(str(err)) or type(err).__name__
    return False, f"{type(err).__name__}: {first_line(str(err))}".rstrip(": ")


def _failed(rq_job, ids, err: BaseException) -> None:
    """Record a failure: back to queued if RQ will retry it, else failed with its reason."""
    permanent, reason = classify(err)
    retry = not permanent and bool(rq_job.retries_left and rq_job.retries_left > 0)
    if permanent:
        rq_job.retries_left = 0
    rq_job.meta["reason"] = reason
    rq_job.save_meta()
    state = JobStatus.QUEUED if retry else JobStatus.FAILED
    sweepstate.transition(rq_job.connection, *ids, state, allowed=(JobStatus.RUNNING,), reason=reason)
    log.warning("job.failed", job_id=ids[2], reason=reason, retry=retry, permanent=permanent)


def run_queued_job(job: dict) -> dict[str, Any]:
    """Run one job for RQ (a JobSpec as a JSON dict) and keep the sweep's state."""
    from rq import get_current_job

    from worker.engine.job import run_job

    lent = _lent.get()
    if lent is None:
        raise PermanentJobError("run_queued_job runs inside decodebench-worker, which lends it a store and a device")
    rq_job = get_current_job()
    try:
        spec = JobSpec.model_validate(job)
    except Exception as err:
        rq_job.retries_left = 0
        raise PermanentJobError(classify(err)[1]) from None
    conn = rq_job.connection
    ids = (spec.tenant, spec.sweep_id, spec.job_id, spec.cell)
    startable = ("none", JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED)
    applied, old = sweepstate.transition(conn, *ids, JobStatus.RUNNING, allowed=startable)
    if not applied and old != JobStatus.RUNNING:
        log.info("job.not_run", job_id=spec.job_id, state=old)
        return {"job_id": spec.job_id, "status": "skipped" if old == JobStatus.DONE else old}
    try:
        lent.active.set()
        try:
            out = run_job(spec, store=lent.store, runtime=lent.runtime)
        finally:
            lent.active.clear()
    except Interrupted as err:
        state = JobStatus.QUEUED if err.why == "shutdown" else JobStatus.CANCELLED
        sweepstate.transition(conn, *ids, state, allowed=(JobStatus.RUNNING,))
        raise
    except BaseException as err:
        _failed(rq_job, ids, err)
        raise
    sweepstate.transition(
        conn, *ids, JobStatus.DONE, new_tokens=int(out.get("new_tokens", 0) or 0), generations=len(spec.prompts)
    )
    return out
