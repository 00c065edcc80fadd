"""The hooked RQ worker: RQ's SimpleWorker with rq 3.0.0's hooks overridden, decodebench's logic injected.

`HookedWorker` is the one class that overrides RQ's worker hooks and touches its private state
(`_ordered_queues`, `_stopped_job_id`, `_stop_requested`, `_shutdown_requested_date`). What to do
at each hook is decodebench's, asked of a `WorkerLogic` (`worker.rq.worker.DecodebenchLogic`, given
to the constructor: worker.core never imports worker.rq; the base class and its defaults are
`logic.WorkerLogic`). What stays here is RQ's side:

- no fork: the job runs in-process, and a heartbeat thread keeps RQ's worker/execution/job
  heartbeats fresh while it runs (with a short TTL), and runs the logic's beat and maintenance;
- interrupting the running job in-process: a signal to the main thread raises `Interrupted` inside
  the job's own code (cancel: RQ marks it STOPPED, never retried; shutdown: it goes back to the
  front of its queue), for RQ's stop-job and stop-execution commands, a cancelled sweep, SIGTERM;
- SIGTERM: an idle worker exits at once; a busy one finishes the current job within the logic's
  `stop_grace`, else it is interrupted and requeued; a second SIGTERM requeues at once;
- stopping promptly: the helper threads (RQ's pubsub listener, the heartbeat) block the stop
  signals, so SIGTERM always interrupts the main thread's pop; RQ's `unsubscribe`, which waited
  up to 60 s for its listener's read, tells the listener to stop before the UNSUBSCRIBE;
- a refused job (the logic's verdict, carried by `SealedJob.refusal`) fails inside RQ's own
  failure path, never retried, never run; a job found twice runs once; a job the logic holds back
  (`held_back`: its tenant left the tenants file while the dequeue that took it waited) goes back
  to the front of its queue, neither run nor failed.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

import structlog
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from rq import SimpleWorker, worker_registration
from rq.exceptions import StopRequested
from rq.job_lifecycle import call_exception_handlers
from rq.utils import now, utcparse
from rq.worker import WorkerStatus

from worker.core.contract import JobRef
from worker.core.errors import DecodebenchError, Interrupted, PermanentJobError, UsageError
from worker.core.rqadapter.job import SealedJob
from worker.core.rqadapter.logic import WorkerLogic
from worker.core.rqadapter.persistence import SERIALIZER, DeserializationError, Status
from worker.core.rqadapter.queue import ReliableQueue

log = structlog.get_logger("decodebench.worker")
INTERRUPT_SIGNAL = signal.SIGUSR1
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, INTERRUPT_SIGNAL}  # the main thread's to handle
STUCK_IN_INTERMEDIATE = "Job was stuck in intermediate queue."  # rq.intermediate_queue's reason
RUNNABLE = (Status.QUEUED, Status.CREATED)


class _Running(NamedTuple):
    """The job the main thread runs now, as the heartbeat thread and the interrupts see it."""

    job: SealedJob
    execution: object | None  # RQ's Execution
    ref: JobRef | None  # where it sits in a sweep (the logic's `running`)
    tenant: str


class HookedWorker(SimpleWorker):
    queue_class = ReliableQueue
    job_class = SealedJob

    def __init__(self, logic: WorkerLogic, **kwargs) -> None:
        self.logic = logic  # before RQ's __init__, which reads the hooks
        # A dead worker's record outlives its last heartbeat by worker_ttl + 60 s: by RQ's default (420 s) a
        # killed worker stayed `busy` in `rq info` and `cluster status` for 8 minutes after its job was requeued.
        kwargs.setdefault("worker_ttl", max(1, math.ceil(logic.heartbeat_ttl)))
        super().__init__([], serializer=SERIALIZER, job_monitoring_interval=max(1, int(logic.beat_s)), **kwargs)
        self._born: float | None = None
        self._jobs_ok = self._jobs_failed = 0
        self._lock = threading.Lock()
        self._current: _Running | None = None  # while a job runs
        self._pending: str | None = None  # "shutdown" or "cancel": interrupt the job when possible
        self._requeue_job_id: str | None = None
        self._stop_deadline: float | None = None
        self._beat_stop = threading.Event()
        self._beat_thread: threading.Thread | None = None
        logic.attach(self)

    # -- queues ---------------------------------------------------------------------------------
    def set_queues(self, queues: list[ReliableQueue], order: list[ReliableQueue]) -> None:
        """The worker's queues, and the order RQ's dequeue tries them in (`Worker._ordered_queues`)."""
        self.queues = queues
        self._ordered_queues = order

    @property
    def tenants(self) -> list[str]:
        return self.logic.tenants

    def reorder_queues(self, reference_queue: ReliableQueue) -> None:
        self.logic.dequeued_from(reference_queue)

    @property
    def dequeue_timeout(self) -> int:
        # Short blocking pops so that new tenants (with `*`) and stop requests are seen soon.
        return max(1, min(self.worker_ttl - 15, int(self.logic.reaper_interval)))

    def heartbeat(self, timeout: int | None = None, pipeline=None) -> None:
        """RQ's heartbeat, with the worker's registration renewed: RQ registers a worker once, at its birth, so
        after Redis restarted without its data (or another worker's maintenance dropped a hash that expired) a
        live worker was in no worker set, out of `rq info` and `cluster status`, until it restarted."""
        if self.birth_date is None:  # not registered yet (or used without `work`): nothing to renew
            return super().heartbeat(timeout, pipeline=pipeline)
        pipe = pipeline if pipeline is not None else self.connection.pipeline()
        super().heartbeat(timeout, pipeline=pipe)  # its HSET of last_heartbeat comes first
        worker_registration.register(self, pipe)  # SADDs: the worker set and each of its queues' sets
        pipe.hsetnx(self.key, "state", self.get_state())  # only where it was lost: never over a newer one
        if pipeline is not None:  # RQ's maintain_heartbeats writes the whole hash again where it was gone
            return
        with pipe:
            created = pipe.execute()[0]
        if created:  # the hash was gone: RQ's HSET wrote last_heartbeat alone
            with self.connection.pipeline() as again:
                again.hset(self.key, mapping=self.serialize())
                again.expire(self.key, timeout or self.worker_ttl + 60)
                again.execute()
            log.warning("worker.registered_again", worker=self.name, why="its Redis record was gone")

    def get_heartbeat_ttl(self, job, working_time: float = 0.0) -> int:
        # SimpleWorker would use the job timeout + 60 s: a killed worker's job would wait that long.
        return max(1, int(round(self.logic.heartbeat_ttl)))

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """As RQ's, but a burst worker leaves only when no job of its queues can still come back."""
        while True:
            if not self._ordered_queues:
                self.logic.refresh_queues()
            if self._ordered_queues:
                result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
                if result is not None or timeout is not None:
                    return result
            elif timeout is not None:
                self.heartbeat()
            if timeout is None and not self.logic.work_may_come_back():
                return None
            time.sleep(self.logic.beat_s)

    # -- running a job ----------------------------------------------------------------------------
    def execute_job(self, job, queue) -> None:
        """Run the job once: only where the logic claims it and RQ has it queued (not finished, failed
        or started already). Another copy of its id is dropped, never failed. A job the logic holds
        back goes back to the front of its queue, untouched."""
        held = self.logic.held_back(queue.tenant)
        if held:
            self._put_back(job, queue, held)
            return
        status = job.get_status(refresh=False)
        why = self.logic.claim(job.id, queue.tenant, None if status in RUNNABLE else str(status))
        if why:
            self.connection.lrem(queue.intermediate_queue_key, 1, job.id)
            log.warning("job.duplicate_dropped", job_id=job.id, queue=queue.name, why=why)
            return
        try:
            super().execute_job(job, queue)
        finally:
            self.logic.release(job.id, queue.tenant)

    def _put_back(self, job, queue: ReliableQueue, why: str) -> None:
        """Return a job just taken (still queued for RQ: only its id moved) to the front of its queue,
        in one transaction, and give back the tenant's slot that the dequeue may have taken."""
        with self.connection.pipeline() as pipe:  # MULTI: the id is in exactly one of the two lists
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            pipe.lpush(queue.key, job.id)
            pipe.execute()
        if queue.slots is not None:
            queue.slots.release_slot(self.connection, queue.tenant, job.id)
        log.info("job.put_back", job_id=job.id, queue=queue.name, why=why)

    def prepare_job_execution(self, job, remove_from_intermediate_queue: bool = False) -> None:
        why = job.refusal  # perform_job's verdict, carried by the job through RQ's perform_job
        try:
            super().prepare_job_execution(job, remove_from_intermediate_queue=True)  # every queue uses it
        except DeserializationError:  # RQ names the job's function after its bookkeeping
            if not why:
                raise
        if why:  # fails the job inside RQ's own failure path, never retried, never run
            self.logic.fail_refused(job, why)
            raise PermanentJobError(why)

    def perform_job(self, job, queue, execution) -> bool:
        job.refusal = why = self.logic.refusal(job, queue.tenant)
        with self.logic.running(job, queue.tenant, refused=bool(why)) as ref:
            with self._lock:
                self._current = _Running(job, execution, ref, queue.tenant)
            try:
                return super().perform_job(job, queue, execution)
            finally:
                with self._lock:
                    self._current = self._pending = None
                    if self._stopped_job_id == job.id:
                        self._stopped_job_id = None

    def handle_exception(self, job, *exc_info):
        if exc_info and isinstance(exc_info[1], Interrupted):
            log.info("job.interrupted", job_id=job.id, why=exc_info[1].why)
            return
        if exc_info and isinstance(exc_info[1], DecodebenchError):  # an expected refusal (a model that cannot
            # load, a job the policy refuses): its one line says it all; RQ's own logging adds the traceback
            reason = str(exc_info[1]).splitlines()[0] if str(exc_info[1]) else type(exc_info[1]).__name__
            log.warning("job.refused", job_id=job.id, queue=job.origin, reason=reason)
            call_exception_handlers(self._exc_handlers, job, *exc_info)
            return
        super().handle_exception(job, *exc_info)

    def handle_job_failure(self, job, queue, started_job_registry=None, exc_string="", execution=None):
        # Interrupted by shutdown, or found by RQ's maintenance in an intermediate list (its worker
        # died between taking and starting it): not the job's fault, back to the front of its queue.
        # The run is over: its lock goes before any requeue, so the next taker is not a duplicate.
        self.logic.release(job.id, queue.tenant)
        stuck = exc_string == STUCK_IN_INTERMEDIATE
        if self._requeue_job_id == job.id or stuck:
            self._requeue_job_id = None
            with self.connection.pipeline() as pipe:
                self.cleanup_execution(job, pipeline=pipe, execution=execution)
                pipe.execute()
            queue.enqueue_job(job, at_front=True)
            why = "taken by a worker that died" if stuck else "worker shutting down"
            log.info("job.requeued", job_id=job.id, queue=queue.name, why=why)
            return
        super().handle_job_failure(
            job, queue, started_job_registry=started_job_registry, exc_string=exc_string, execution=execution
        )

    def increment_successful_job_count(self, pipeline=None) -> None:  # RQ counts in Redis only
        self._jobs_ok += 1
        super().increment_successful_job_count(pipeline)

    def increment_failed_job_count(self, pipeline=None) -> None:
        self._jobs_failed += 1
        super().increment_failed_job_count(pipeline)

    # -- interrupting the running job --------------------------------------------------------------
    def interrupt(self, why: str) -> None:
        """Ask the main thread to raise Interrupted(why) inside the job (from any thread)."""
        with self._lock:
            if self._current is None:
                return
            job = self._current.job
            self._pending = why
            if why == "cancel":
                self._stopped_job_id = job.id  # RQ marks it STOPPED when it fails, never retried
            else:
                self._requeue_job_id = job.id
        os.kill(os.getpid(), INTERRUPT_SIGNAL)

    def _on_interrupt_signal(self, signum, frame) -> None:
        why = self._pending
        if why and self._current is not None and self.logic.in_job_code():
            self._pending = None
            raise Interrupted(why)
        # Not inside the job's own code right now: the heartbeat thread signals again.

    def request_stop_execution(self, execution_id: str) -> None:
        """RQ's stop-execution command."""
        current = self._current
        if current is not None and current.execution is not None and current.execution.id == execution_id:
            self.interrupt("cancel")

    def kill_horse(self, sig=None) -> None:
        """RQ's stop-job command lands here; there is no horse: interrupt the job in-process."""
        self.interrupt("cancel")

    def request_stop(self, signum, frame) -> None:
        """First SIGTERM/SIGINT: finish the current job (within stop_grace), then exit."""
        self._shutdown_requested_date = now()
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)
        if self.get_state() != WorkerStatus.BUSY:
            raise StopRequested()
        self._stop_requested = True  # RQ's main loop leaves after the current job
        self.set_shutdown_requested_date()
        grace = self.logic.stop_grace
        if grace is not None:
            self._stop_deadline = time.monotonic() + grace
        log.info("worker.stopping", finish_within_s=grace, then="requeue the job")
        if grace == 0:
            self.interrupt("shutdown")

    def request_force_stop(self, signum, frame) -> None:
        """Second SIGTERM/SIGINT: requeue the current job now and exit."""
        at = self._shutdown_requested_date
        if at is not None and (now() - at).total_seconds() < 1:
            return
        if self.get_state() != WorkerStatus.BUSY:
            raise SystemExit()
        log.warning("worker.stopping_now", then="requeue the job")
        self.interrupt("shutdown")

    # -- start, stop, the heartbeat thread ----------------------------------------------------------
    def bootstrap(self, *args, **kwargs) -> None:
        self._born = time.monotonic()
        with _stop_signals_blocked():  # threads started here (RQ's pubsub listener) inherit the mask
            super().bootstrap(*args, **kwargs)
        signal.signal(INTERRUPT_SIGNAL, self._on_interrupt_signal)  # the heartbeat thread's interrupts
        self._beat_thread = threading.Thread(target=self._beat_loop, name="decodebench-heartbeat", daemon=True)
        self._beat_thread.start()

    def register_birth(self) -> None:
        """RQ's, where a worker of the same name (a fixed `--name`) left a record: RQ refused the name, with a
        traceback, until the record expired. A record whose last heartbeat is older than the heartbeat TTL is a
        worker that died without deregistering (its jobs are the reaper's): taken over. A live one: one line."""
        last, dead = self.connection.hmget(self.key, ["last_heartbeat", "death"])
        if last is not None and dead is None:
            try:
                age = (now() - utcparse(last.decode())).total_seconds()
            except ValueError:  # not RQ's timestamp: no live worker wrote it
                age = math.inf
            if age < self.logic.heartbeat_ttl:
                raise UsageError(
                    f"--name {self.name}: a worker of that name is running (its last heartbeat {age:.0f} s ago); "
                    "give another name, or none"
                )
            self.connection.delete(self.key)
            log.warning("worker.name_taken_over", name=self.name, last_heartbeat_s_ago=round(age))
        super().register_birth()

    def unsubscribe(self) -> None:
        thread = getattr(self, "pubsub_thread", None)
        if not thread:
            return
        thread.stop(timeout=0)  # clears its flag, does not wait
        try:
            self.pubsub.unsubscribe()  # the reply wakes the listener, which closes the pubsub
        except Exception as err:  # Redis gone: the daemon thread dies with the process
            log.warning("worker.unsubscribe_failed", error=str(err))
        thread.join(timeout=1)

    def teardown(self) -> None:
        self._beat_stop.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=5)
        # stopping: one try per call (redis-py retries 10 times with backoff, a minute where Redis is gone)
        self.connection.set_retry(Retry(NoBackoff(), 0))
        try:
            super().teardown()  # RQ deregisters the worker
        except RedisError as err:  # Redis stopped first (with everything else): nothing left to deregister from
            log.warning("worker.deregister_failed", error=str(err))
        finally:
            self.logic.stopped(self.name, self._born, self._jobs_ok, self._jobs_failed)

    def _beat_loop(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the main thread's to handle
        next_maintenance = 0.0
        while True:
            self.logic.touch()
            try:
                self._beat()
                if time.monotonic() >= next_maintenance:
                    next_maintenance = time.monotonic() + self.logic.reaper_interval
                    self.logic.maintain()
            except RedisError as err:  # Redis restarting: RQ's main loop backs off; we retry next beat
                log.warning("worker.redis_unavailable", error=str(err))
            except Exception:
                log.exception("worker.heartbeat_error")
            if self._beat_stop.wait(self.logic.beat_s):
                return

    def _beat(self) -> None:
        current = self._current
        if current is None:
            return
        job, ref = current.job, current.ref
        self.maintain_heartbeats(job, current.execution)
        self.logic.beat(job.id, current.tenant, ref)
        if ref is None:
            return
        if self._pending:  # the job was busy in non-interruptible code: ask again
            os.kill(os.getpid(), INTERRUPT_SIGNAL)
        elif self.logic.cancelled(ref):
            log.info("job.cancelling", job_id=job.id, sweep_id=ref.sweep_id)
            self.interrupt("cancel")
        elif self._stop_deadline is not None and time.monotonic() > self._stop_deadline:
            self.interrupt("shutdown")

    def run_maintenance_tasks(self) -> None:
        self.logic.reap()  # before RQ's own abandoned-job cleanup
        super().run_maintenance_tasks()


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
