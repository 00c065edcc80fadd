"""decodebench's side of the hooked worker: `WorkerLogic`, what `HookedWorker` asks at RQ's hooks.

A base class with the defaults a worker needs unless it says otherwise; each worker writes only what
is its own. The two: `worker.rq.worker.DecodebenchLogic` (the GPU worker: fair share, slots, sweep
state, reaper) and `controller.report.distribute.mapworker.ReportLogic` (the report worker). Neither sees RQ:
what they do to an RQ job goes through the adapter (`fail_for_good`, ...).

Every subclass writes the run lock (`claim`, `release`, `beat`: decodebench's sweep state, which
worker.core may not import), the verdict on a job (`refusal`), what is around its run (`running`)
and when its own code runs (`in_job_code`). The defaults:

- queues: the worker's queues are its tenants', taken in round robin (`dequeued_from`), none found
  later (`refresh_queues`), and a burst worker waits while any is queued, taken or scheduled;
- no job is held back (`held_back`); a refused job fails for good with its reason (`fail_for_good`),
  never retried;
- no sweep to cancel a job (`cancelled`), nothing lost to reap (`reap`); maintenance looks for new
  queues; every beat touches the liveness file, if any; the last line is `stopped_event`.
"""

from __future__ import annotations

import abc
import contextlib
import time
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from worker.core.contract import JobRef
from worker.core.liveness import touch
from worker.core.rqadapter.persistence import fail_for_good
from worker.core.rqadapter.queue import ReliableQueue, queued_taken_or_scheduled

if TYPE_CHECKING:
    from worker.core.rqadapter.job import SealedJob


class Hooked(Protocol):
    """What a logic uses of the worker it is attached to (`worker.HookedWorker`, which imports this module)."""

    name: str
    connection: Any
    queues: list[ReliableQueue]

    def set_queues(self, queues: list[ReliableQueue], order: list[ReliableQueue]) -> None: ...


class WorkerLogic(abc.ABC):
    """decodebench's side of the worker, which `HookedWorker` calls at RQ's hooks."""

    beat_s: float = 10.0  # the heartbeat thread's period
    heartbeat_ttl: float = 60.0  # RQ's job/execution heartbeats and decodebench's run lock and slot
    reaper_interval: float = 15.0  # maintenance, busy or idle
    stop_grace: float | None = None  # after SIGTERM, how long the current job may still run (None: its timeout)
    heartbeat_file: str | None = None  # the liveness file the pod's probes read (None: none)
    log_name = "decodebench.worker"  # the structlog logger of the worker's own lines
    stopped_event = "worker.stopped"  # the worker's last line
    worker: Hooked | None = None

    # -- the worker and its queues ---------------------------------------------------------------
    def attach(self, worker: Hooked) -> None:
        """Bind to the worker: its queues (`worker.set_queues`), connection and name."""
        self.worker = worker

    @property
    def connection(self):
        return self.worker.connection

    @property
    def tenants(self) -> list[str]:
        return [q.tenant for q in self.worker.queues]

    def dequeued_from(self, queue: ReliableQueue) -> None:
        """A job was taken from `queue`: reorder the queues (here: round robin, the queue just served goes last)."""
        order = [q for q in self.worker.queues if q.name != queue.name] + [queue]
        self.worker.set_queues(self.worker.queues, order)

    def refresh_queues(self) -> None:
        """Look for new queues (a wildcard worker's new tenants): here, none."""
        return None

    def work_may_come_back(self) -> bool:
        """Whether a burst worker with nothing to take should wait rather than leave."""
        return queued_taken_or_scheduled(self.connection, self.worker.queues)

    # -- running a job ---------------------------------------------------------------------------
    @abc.abstractmethod
    def claim(self, job_id: str, tenant: str, status: str | None) -> str | None:
        """Take the job's run lock (`status`: RQ's, None when queued); why not to run it, else None."""

    @abc.abstractmethod
    def release(self, job_id: str, tenant: str) -> None:
        """Release the job's run lock."""

    def held_back(self, tenant: str) -> str | None:
        """Why a job just taken from `tenant`'s queue goes back to the front of that queue, neither run
        nor failed (None: it is run or refused). Here: never."""
        return None

    @abc.abstractmethod
    def refusal(self, job: SealedJob, tenant: str) -> str | None:
        """Why the worker will not run this job, or None."""

    def fail_refused(self, job: SealedJob, why: str) -> None:
        """Record a refused job's failure: for good, its reason in RQ's meta."""
        fail_for_good(job, why)

    @abc.abstractmethod
    def running(self, job: SealedJob, tenant: str, refused: bool) -> contextlib.AbstractContextManager[JobRef | None]:
        """Around the job's run: what it is lent and what the worker records; yields where it sits in a
        sweep (None: in none, or refused)."""

    @abc.abstractmethod
    def in_job_code(self) -> bool:
        """Whether the job's own code runs now (the only time it may be interrupted)."""

    # -- every beat, and maintenance -------------------------------------------------------------
    @abc.abstractmethod
    def beat(self, job_id: str, tenant: str, ref: JobRef | None) -> None:
        """Every beat while a job runs: keep its run lock (and its slot and sweep heartbeat, if any)."""

    def cancelled(self, ref: JobRef) -> bool:
        """Whether the running job's sweep was cancelled."""
        return False

    def touch(self) -> None:
        """Every beat, busy or idle: the liveness file."""
        touch(self.heartbeat_file)

    def maintain(self) -> None:
        """Every reaper interval, busy or idle."""
        self.refresh_queues()

    def reap(self) -> None:
        """Before RQ's own maintenance: lost jobs (none here: RQ's maintenance fails abandoned jobs)."""
        return None

    def stopped(self, name: str, born: float | None, ok: int, failed: int) -> None:
        """The worker stops (its last line)."""
        uptime = 0.0 if born is None else time.monotonic() - born
        runs = {"jobs_run": ok + failed, "jobs_failed": failed, "uptime_s": round(uptime, 1)}
        structlog.get_logger(self.log_name).info(self.stopped_event, name=name, **runs)
