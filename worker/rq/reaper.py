"""Lost jobs: the reaper every worker runs on a timer, and RQ's due retries.

`reap(...)` finds jobs whose worker stopped heartbeating (killed, OOM, lost node) and
requeues them, at most `max_lost` times per job; a lost job of a cancelled sweep is cancelled
instead, as cancel cancels a queued one, and never runs again. Reaping is the workers' duty alone:
reading a sweep's status never changes it. `Timing` holds the failure-detection
timings; docs/distributed.md derives the bounds they give.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from worker import sweepstate
from worker.core import keys, rqadapter, settings
from worker.core.contract import JobRef, JobStatus
from worker.core.rqadapter import Status as RQStatus
from worker.core.rqadapter.job import sealed_job_class
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
    ids = JobRef(tenant, *member)
    sweep_id, job_id = ids.sweep_id, ids.job_id
    running = (JobStatus.RUNNING,)
    job = rqadapter.fetch(conn, sealed_job_class(tenant), job_id)
    if job is None:
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
    # every worker reaps every tenant (worker.rq.worker.reaped_tenants): the line names whose job it was
    log.warning("job.lost", tenant=tenant, job_id=job_id, sweep_id=sweep_id, rq_status=str(status), times=losses)
    if status == RQStatus.FINISHED:
        sweepstate.transition(conn, *ids, JobStatus.DONE, allowed=running)
    elif status in (RQStatus.STOPPED, RQStatus.CANCELED):
        sweepstate.transition(conn, *ids, JobStatus.CANCELLED, allowed=running)
    elif sweepstate.is_cancelled(conn, tenant, sweep_id):  # cancelled while its worker was dead: never rerun
        slots.drop_run(conn, tenant, job_id)
        rqadapter.cancel_lost(conn, tenant, job, keys.FAILURE_TTL, time.time())
        sweepstate.transition(conn, *ids, JobStatus.CANCELLED, allowed=running)
    elif status in (RQStatus.QUEUED, RQStatus.SCHEDULED):  # RQ's own cleanup requeued it
        sweepstate.transition(conn, *ids, JobStatus.QUEUED, allowed=running)
    elif losses > timing.max_lost:
        reason = (
            f"lost {losses} times: its worker died or stopped heartbeating while running it (killed? out of memory?)"
        )
        rqadapter.drop_started(conn, job.origin, job_id)
        rqadapter.fail(conn, job, reason)
        sweepstate.transition(conn, *ids, JobStatus.FAILED, allowed=running, reason=reason)
    else:
        rqadapter.drop_started(conn, job.origin, job_id)
        slots.drop_run(conn, tenant, job_id)  # its worker is gone: the next taker runs it
        rqadapter.requeue_front(conn, job, failed=status == RQStatus.FAILED)  # RQ's cleanup failed it as abandoned
        sweepstate.transition(conn, *ids, JobStatus.QUEUED, allowed=running)
        return True
    return False


def _reap_taken_not_started(conn, tenant: str, timing: Timing) -> list[str]:
    """Jobs left in RQ's intermediate lists by a worker that died between taking and starting them."""
    out = []
    for name in keys.tenant_queues(tenant):
        queue = rqadapter.queue_of(conn, name, sealed_job_class(tenant))
        taken = rqadapter.requeue_taken_not_started(
            conn, queue, timing.heartbeat_ttl, lambda job_id: slots.drop_run(conn, tenant, job_id)
        )
        for job_id in taken:
            log.warning("job.lost_before_start", tenant=tenant, job_id=job_id, queue=name)
        out += taken
    return out


def enqueue_due_retries(conn, queues) -> None:
    """Move retries whose backoff has elapsed from RQ's scheduled registries to their queues
    (`rqadapter.enqueue_due_retries`, each queue with its own per-tenant job class)."""
    for queue in queues:
        rqadapter.enqueue_due_retries(conn, queue)
