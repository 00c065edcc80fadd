"""Lost jobs: the reaper every worker runs on a timer, and RQ's due retries.

`reap(...)` finds jobs whose worker stopped heartbeating (killed, OOM, lost node) and
requeues them, at most `max_lost` times per job. Reaping is the workers' duty alone:
reading a sweep's status never changes it. `Timing` holds the failure-detection
timings; docs/distributed.md derives the bounds they give.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import structlog

from worker import sweepstate
from worker.core import keys, rqadapter, settings
from worker.core.contract import JobStatus
from worker.rq.sealed import sealed_job_class
from worker.sweepstate import slots

log = structlog.get_logger("decodebench.reaper")


@dataclass(frozen=True)
class Timing:
    """Failure-detection timings (seconds); see docs/distributed.md for the bounds they give."""

    heartbeat_ttl: float = 60.0  # a running job whose worker is silent this long is lost
    reaper_interval: float = 15.0  # how often every worker looks for lost jobs
    max_lost: int = 3  # a job lost this many times fails instead of being requeued again

    @property
    def beat(self) -> float:
        return max(0.2, self.heartbeat_ttl / 6)

    @classmethod
    def from_settings(cls, **flags: Any) -> Timing:
        """Flags (None: not given), else DECODEBENCH_HEARTBEAT_TTL / _REAPER_INTERVAL / _MAX_LOST, else defaults."""
        return cls(
            **{name: settings.get(name, flags.get(name)) for name in ("heartbeat_ttl", "reaper_interval", "max_lost")}
        )

    @property
    def detection_bound(self) -> float:
        """Longest time from a worker's death to its job being requeued (one reaper alive)."""
        return self.heartbeat_ttl + self.reaper_interval


def _drop_started(conn, queue_name: str, job_id: str) -> None:
    """Remove the dead execution from RQ's started registry so RQ does not handle it twice."""
    from rq.registry import StartedJobRegistry

    registry = StartedJobRegistry(queue_name, connection=conn)
    stale = [m for m in conn.zrange(registry.key, 0, -1) if m.decode().split(":")[0] == job_id]
    if stale:
        conn.zrem(registry.key, *stale)


def reap(conn, tenants, timing: Timing | None = None) -> list[str]:
    """Requeue every job of `tenants` whose worker stopped heartbeating; return their ids."""
    timing = timing or Timing.from_settings()
    reaped = []
    for tenant in tenants:
        reaped += _reap_taken_not_started(conn, tenant, timing)
        for member in sweepstate.claim_lost(conn, tenant):
            if _recover(conn, tenant, member, timing):
                reaped.append(member[1])
    return reaped


def _recover(conn, tenant: str, member: tuple[str, str, str], timing: Timing) -> bool:
    """Settle one lost job by what RQ knows of it; True if it was requeued."""
    from rq import Queue
    from rq.exceptions import NoSuchJobError
    from rq.job import JobStatus as RQStatus
    from rq.job_lifecycle import record_job_failure
    from rq.serializers import JSONSerializer

    sweep_id, job_id, cell = member
    ids = (tenant, sweep_id, job_id, cell)
    running = (JobStatus.RUNNING,)
    try:
        job = sealed_job_class(tenant).fetch(job_id, connection=conn, serializer=JSONSerializer)
    except NoSuchJobError:
        sweepstate.transition(
            conn,
            *ids,
            JobStatus.FAILED,
            allowed=running,
            reason="lost with its worker, and its RQ job is gone: resubmit with --retry-failed",
        )
        return False
    status = job.get_status()
    losses = sweepstate.record_loss(conn, tenant, sweep_id, job_id)
    log.warning("job.lost", job_id=job_id, sweep_id=sweep_id, rq_status=str(status), times=losses)
    if status in (RQStatus.QUEUED, RQStatus.SCHEDULED):  # RQ's own cleanup requeued it
        sweepstate.transition(conn, *ids, JobStatus.QUEUED, allowed=running)
    elif status == RQStatus.FINISHED:
        sweepstate.transition(conn, *ids, JobStatus.DONE, allowed=running)
    elif status in (RQStatus.STOPPED, RQStatus.CANCELED):
        sweepstate.transition(conn, *ids, JobStatus.CANCELLED, allowed=running)
    elif losses > timing.max_lost:
        reason = (
            f"lost {losses} times: its worker died or stopped heartbeating while running it (killed? out of memory?)"
        )
        _drop_started(conn, job.origin, job_id)
        with conn.pipeline() as pipe:
            record_job_failure(job, reason, pipe)
            pipe.execute()
        sweepstate.transition(conn, *ids, JobStatus.FAILED, allowed=running, reason=reason)
    else:
        _drop_started(conn, job.origin, job_id)
        if status == RQStatus.FAILED:  # RQ's cleanup failed it as abandoned: undo
            job.failed_job_registry.remove(job)
        queue = Queue(job.origin, connection=conn, serializer=JSONSerializer, job_class=type(job))
        slots.drop_run(conn, tenant, job_id)  # its worker is gone: the next taker runs it
        queue.enqueue_job(job, at_front=True)
        sweepstate.transition(conn, *ids, JobStatus.QUEUED, allowed=running)
        return True
    return False


def _reap_taken_not_started(conn, tenant: str, timing: Timing) -> list[str]:
    """Jobs left in RQ's intermediate lists by a worker that died between taking and starting them."""
    from rq import Queue
    from rq.intermediate_queue import IntermediateQueue
    from rq.job import JobStatus as RQStatus
    from rq.serializers import JSONSerializer

    out = []
    for name in keys.tenant_queues(tenant):
        queue = Queue(name, connection=conn, serializer=JSONSerializer, job_class=sealed_job_class(tenant))
        pending = IntermediateQueue(queue.key, conn)
        for job_id in pending.get_job_ids():
            job = queue.fetch_job(job_id)
            if job is None:
                pending.remove(job_id)
                continue
            if job.get_status() != RQStatus.QUEUED or pending.set_first_seen(job_id):
                continue
            first = pending.get_first_seen(job_id)
            if first is None or time.time() - first.timestamp() < timing.heartbeat_ttl:
                continue
            if conn.lrem(pending.key, 1, job_id):  # we own it now
                slots.drop_run(conn, tenant, job_id)
                queue.enqueue_job(job, at_front=True)
                conn.delete(pending.get_first_seen_key(job_id))
                log.warning("job.lost_before_start", job_id=job_id, queue=name)
                out.append(job_id)
    return out


def enqueue_due_retries(conn, queues) -> None:
    """Move retries whose backoff has elapsed from RQ's scheduled registries to their queues.

    As RQScheduler.enqueue_scheduled_jobs, with each queue's own (per-tenant) job class, which
    RQ's scheduler does not take. Each move is one transaction that WATCHes the registry, so
    two workers never both enqueue a job and a dying worker never drops one.
    """
    from redis.exceptions import WatchError
    from rq.registry import ScheduledJobRegistry
    from rq.utils import current_timestamp

    for queue in queues:
        registry = ScheduledJobRegistry(queue=queue)
        for job_id in registry.get_jobs_to_schedule(current_timestamp()):
            job = queue.fetch_job(job_id)
            if job is None:
                conn.zrem(registry.key, job_id)
                continue
            with conn.pipeline() as pipe, contextlib.suppress(WatchError):
                pipe.watch(registry.key)
                if pipe.zscore(registry.key, job_id) is None:
                    continue  # another worker moved it
                pipe.multi()
                rqadapter.enqueue_in_transaction(pipe, queue, job)
                pipe.zrem(registry.key, job_id)
                pipe.execute()
