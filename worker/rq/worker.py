"""The RQ worker of decodebench: one process, one pinned device, one engine, jobs run in-process.

`DecodebenchWorker` is RQ's `SimpleWorker` (no fork: CUDA is initialised once and the
model cache survives across jobs) plus what a fork-less worker lacks:

- a heartbeat thread that keeps RQ's worker/execution/job heartbeats and decodebench's own per-job
  deadline fresh while a job runs, with a short TTL, and runs the reaper (`worker.rq.reaper.reap`) and
  due retries on a timer, busy or idle;
- the job runs with the worker's own store and runtime, lent to `run_queued_job` (`worker.rq.task.lend`);
- weighted fair share across tenants (`worker.rq.fair`: stride scheduling by the tenants file's
  weights), high before normal before low inside a tenant, a tenant's `max_running` held across
  workers (`worker.sweepstate.slots`); a job id taken twice runs once;
- it takes only its engine's queues (`worker.core.keys`), and a job of another engine fails for good;
- a job is run only if its payload carries the submission server's signature for its tenant and id
  (checked before a byte is inflated, inflated under DECODEBENCH_MAX_JOB_MB), calls decodebench's task
  for the tenant of the queue it came from, and passes the tenant's policy and the per-job limits
  (`worker.core.policy`); nothing else of the job hash is obeyed (`worker.rq.sealed`); with a tenants
  file, only declared tenants are served, and a changed file is taken between jobs (`worker.rq.reload`);
- SIGTERM: an idle worker exits at once, with a final `worker.stopped` line (`worker.rq.stopping`); a busy
  one finishes the current job (within `stop_grace`, default its own timeout), else interrupt it and
  requeue it at the front; a second SIGTERM requeues at once;
- cancel: a cancelled sweep's running job, or an RQ stop-job command, interrupts it."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid

import structlog
from redis.exceptions import RedisError
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.worker import WorkerStatus

from worker import sweepstate
from worker.core import keys, rqadapter, settings
from worker.core.engines import OWN_ENGINE
from worker.core.errors import PermanentJobError, UsageError
from worker.core.policy import Limits
from worker.core.rqadapter import SERIALIZER, DeserializationError, Status
from worker.core.tenants import TenantsFile, load_tenants
from worker.rq.fair import FairShare
from worker.rq.liveness import touch
from worker.rq.metrics import worker_metrics
from worker.rq.queues import ReliableQueue, discover_queue_names, fair_order, resolve_queue_names, work_may_come_back
from worker.rq.reaper import Timing, enqueue_due_retries, reap
from worker.rq.reload import TenantsReload, reload_tenants
from worker.rq.sealed import SealedJob, sealed_refusal, signing_key
from worker.rq.stopping import STOP_SIGNALS, StopPromptly
from worker.rq.task import Interrupted, Lent, fail_unrunnable, job_ids, lend, refusal
from worker.sweepstate import slots

log = structlog.get_logger("decodebench.worker")
INTERRUPT_SIGNAL = signal.SIGUSR1
STUCK_IN_INTERMEDIATE = "Job was stuck in intermediate queue."  # rq.intermediate_queue's reason


class DecodebenchWorker(StopPromptly, SimpleWorker):
    queue_class = ReliableQueue
    job_class = SealedJob

    def __init__(
        self,
        selectors: list[str],
        *,
        connection,
        store,
        runtime,
        timing: Timing | None = None,
        stop_grace: float | None = None,
        name: str | None = None,
        tenants: TenantsFile | None = None,
        tenants_file: str | None = None,
        heartbeat_file: str | None = None,
        key: bytes | None = None,
        limits: Limits | None = None,
        max_job_bytes: int | None = None,
        engine: str = OWN_ENGINE,
        **kwargs,
    ) -> None:
        """`store`, `runtime` (worker.engine.job.Runtime): lent to every job. `tenants` (weights, quotas,
        models), or `tenants_file`, watched; neither: every tenant. `heartbeat_file`: touched every beat.
        `key`, `limits`, `max_job_bytes`: signatures, per-job cost, payload size (settings' if None).
        `engine`: the one engine the worker runs, whose queues alone it takes."""
        self.signing_key = key or signing_key()
        self.limits = limits or Limits.from_settings()
        self.max_job_bytes = max_job_bytes or int(settings.get("max_job_mb")) * 2**20
        self.timing = timing or Timing.from_settings()
        path = tenants_file if tenants is None else None
        self.tenant_file = tenants if tenants is not None else (load_tenants(path) if path else None)
        self.tenants_reload = TenantsReload(path, self.tenant_file) if path else None
        weights = {t.name: t.weight for t in self.tenant_file.tenants} if self.tenant_file else None
        self.fair = FairShare(weights=weights or {})
        self.lent = Lent(store=store, runtime=runtime)
        device = str(runtime.device)
        self.stop_grace, self.selectors, self.engine = stop_grace, selectors, engine
        declared = None if weights is None else list(weights)
        names, self.wildcard = resolve_queue_names(connection, selectors, declared, engine)
        if not names and not self.wildcard:
            raise UsageError("--queues: no queue given")
        host = socket.gethostname().split(".")[0]
        name = name or f"decodebench-{host}-{os.getpid()}-{device.replace(':', '')}-{uuid.uuid4().hex[:6]}"
        super().__init__(
            [],
            name=name,
            connection=connection,
            serializer=SERIALIZER,
            job_monitoring_interval=max(1, int(self.timing.beat)),
            **kwargs,
        )
        self._set_queues(names)
        self._lock = threading.Lock()
        self._current: tuple | None = None  # (job, execution, ids, tenant) while a job runs
        self._pending: str | None = None  # "shutdown" or "cancel": interrupt the job when possible
        self._requeue_job_id: str | None = None
        self._stop_deadline: float | None = None
        self._beat_stop = threading.Event()
        self._beat_thread: threading.Thread | None = None
        # Touched on every beat, busy or idle: the pod's probes read it (charts/decodebench).
        self.heartbeat_file = heartbeat_file
        self.metrics = worker_metrics(self, device)  # served on DECODEBENCH_METRICS_PORT, if set

    # -- queues and fairness -----------------------------------------------------------------
    def _policy(self, tenant: str):
        return self.tenant_file.get(tenant) if self.tenant_file else None

    def _set_queues(self, names: list[str]) -> None:
        by_name = {q.name: q for q in self.queues}
        for n in names:
            if n not in by_name:
                tenant = keys.parse_queue_name(n)[0]
                policy = self._policy(tenant)
                by_name[n] = ReliableQueue(
                    n,
                    connection=self.connection,
                    serializer=SERIALIZER,
                    max_running=policy.max_running if policy else None,
                    slot_ttl=self.timing.heartbeat_ttl,
                )
                self.fair.add(tenant)
        self.queues = [by_name[n] for n in sorted(by_name)]
        order = fair_order(list(by_name), self.fair.order(), self.engine)
        rqadapter.set_dequeue_order(self, [by_name[n] for n in order])

    def reorder_queues(self, reference_queue: Queue) -> None:
        """After a dequeue from tenant T: charge T, and the tenants tried before it had nothing."""
        parsed = keys.parse_queue_name(reference_queue.name)
        if parsed and parsed[0] in self.fair.passes:
            order = self.fair.order()
            self.fair.charge(parsed[0], skipped=order[: order.index(parsed[0])])
            self._set_queues([q.name for q in self.queues])

    def refresh_queues(self) -> None:
        if not self.wildcard:
            return
        known = {q.name for q in self.queues}
        found = [n for n in discover_queue_names(self.connection, self.engine) if n not in known]
        if found:
            self._set_queues([*known, *found])
            self.connection.hset(self.key, "queues", ",".join(self.queue_names()))
            log.info("worker.queues", added=found)

    @property
    def tenants(self) -> list[str]:
        return list(self.fair.passes)

    @property
    def dequeue_timeout(self) -> int:
        # Short blocking pops so that new tenants (with `*`) and stop requests are seen soon.
        return max(1, min(self.worker_ttl - 15, int(self.timing.reaper_interval)))

    def get_heartbeat_ttl(self, job, working_time: float = 0.0) -> int:
        # SimpleWorker would use the job timeout + 60 s: a killed worker's job would wait that long.
        return max(1, int(round(self.timing.heartbeat_ttl)))

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """As RQ's, but a burst worker leaves only when no job of its queues can still come back:
        none running elsewhere (it might be lost and requeued) and no retry waiting."""
        while True:
            if not rqadapter.dequeue_order(self):
                self.refresh_queues()
            if rqadapter.dequeue_order(self):
                result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
                if result is not None or timeout is not None:
                    return result
            elif timeout is not None:
                self.heartbeat()
            if timeout is None and not work_may_come_back(self.connection, self.tenants, self.queues):
                return None
            time.sleep(self.timing.beat)

    # -- running a job ---------------------------------------------------------------------------
    def execute_job(self, job, queue) -> None:
        """Run the job once: only where its run lock is held, and only if RQ has it queued (not
        finished, failed or started already). Another copy of its id is dropped, never failed."""
        if not slots.hold_run(self.connection, queue.tenant, job.id, self.name, self.timing.heartbeat_ttl):
            return self._drop(job, queue, "another worker runs it")
        try:
            if job.get_status(refresh=False) not in (Status.QUEUED, Status.CREATED):
                slots.release_slot(self.connection, queue.tenant, job.id)
                return self._drop(job, queue, f"it is {job.get_status(refresh=False)} already")
            super().execute_job(job, queue)
        finally:
            slots.release_run(self.connection, queue.tenant, job.id, self.name)

    def _drop(self, job, queue, why: str) -> None:
        self.connection.lrem(queue.intermediate_queue_key, 1, job.id)
        log.warning("job.duplicate_dropped", job_id=job.id, queue=queue.name, why=why)

    def prepare_job_execution(self, job, remove_from_intermediate_queue: bool = False) -> None:
        why = job.refusal  # perform_job's verdict, carried by the job through RQ's perform_job
        try:
            super().prepare_job_execution(job, remove_from_intermediate_queue=True)  # every queue uses it
        except DeserializationError:  # RQ names the job's function after its bookkeeping
            if not why:
                raise
        if why:  # fails the job inside RQ's own failure path, never retried, never run
            fail_unrunnable(job, self.lent.tenant, why)
            raise PermanentJobError(why)

    def perform_job(self, job, queue, execution) -> bool:
        tenant = queue.tenant
        self.lent.tenant = tenant
        why = sealed_refusal(job, self.signing_key, self.max_job_bytes) or refusal(
            job, tenant, self.tenant_file, self.limits, self.engine
        )
        if why:
            log.warning("job.refused", job_id=job.id, tenant=tenant, reason=why)
        job.refusal = why
        ids = None if why else job_ids(job)
        if ids:
            sweepstate.heartbeat_job(self.connection, *ids, self.timing.heartbeat_ttl, create=True)
        with self._lock:
            self._current = (job, execution, ids, tenant)
        started = time.time()
        try:
            with lend(self.lent), self.metrics.job(job, tenant, refused=bool(why)):
                return super().perform_job(job, queue, execution)
        finally:
            with self._lock:
                self._current = None
                self._pending = None
                if rqadapter.stopped_job_id(self) == job.id:
                    rqadapter.mark_stopped(self, None)
            slots.release_slot(self.connection, tenant, job.id)
            if ids:
                sweepstate.forget_job(self.connection, *ids)
                slots.record_usage(self.connection, tenant, job.id, started, time.time())

    def handle_exception(self, job, *exc_info):
        if exc_info and isinstance(exc_info[1], Interrupted):
            log.info("job.interrupted", job_id=job.id, why=exc_info[1].why)
            return
        super().handle_exception(job, *exc_info)

    def handle_job_failure(self, job, queue, started_job_registry=None, exc_string="", execution=None):
        # Interrupted by shutdown, or found by RQ's maintenance in an intermediate list (its worker
        # died between taking and starting it): not the job's fault, back to the front of its queue.
        # The run is over: its lock goes before any requeue, so the next taker is not a duplicate.
        slots.release_run(self.connection, queue.tenant, job.id, self.name)
        if self._requeue_job_id == job.id or exc_string == STUCK_IN_INTERMEDIATE:
            self._requeue_job_id = None
            with self.connection.pipeline() as pipe:
                self.cleanup_execution(job, pipeline=pipe, execution=execution)
                pipe.execute()
            queue.enqueue_job(job, at_front=True)
            log.info(
                "job.requeued",
                job_id=job.id,
                queue=queue.name,
                why="worker shutting down" if exc_string != STUCK_IN_INTERMEDIATE else "taken by a worker that died",
            )
            return
        super().handle_job_failure(
            job, queue, started_job_registry=started_job_registry, exc_string=exc_string, execution=execution
        )

    # -- interrupting the running job --------------------------------------------------------------
    def _interrupt(self, why: str) -> None:
        """Ask the main thread to raise Interrupted(why) inside the job (from any thread)."""
        with self._lock:
            if self._current is None:
                return
            job = self._current[0]
            self._pending = why
            if why == "cancel":
                rqadapter.mark_stopped(self, job.id)  # RQ marks it STOPPED, never retried
            else:
                self._requeue_job_id = job.id
        os.kill(os.getpid(), INTERRUPT_SIGNAL)

    def _on_interrupt_signal(self, signum, frame) -> None:
        why = self._pending
        if why and self._current is not None and self.lent.active.is_set():
            self._pending = None
            raise Interrupted(why)
        # Not inside the job's own code right now: the heartbeat thread signals again.

    def request_stop_execution(self, execution_id: str) -> None:
        """RQ's stop-execution command."""
        current = self._current
        if current is not None and current[1] is not None and current[1].id == execution_id:
            self._interrupt("cancel")

    def kill_horse(self, sig=None) -> None:
        """RQ's stop-job command lands here; there is no horse: interrupt the job in-process."""
        self._interrupt("cancel")

    def request_stop(self, signum, frame) -> None:
        """First SIGTERM/SIGINT: finish the current job (within stop_grace), then exit."""
        rqadapter.note_shutdown_requested(self)
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)
        if self.get_state() != WorkerStatus.BUSY:
            raise StopRequested()
        rqadapter.request_stop_after_job(self)
        self.set_shutdown_requested_date()
        if self.stop_grace is not None:
            self._stop_deadline = time.monotonic() + self.stop_grace
        log.info("worker.stopping", finish_within_s=self.stop_grace, then="requeue the job")
        if self.stop_grace == 0:
            self._interrupt("shutdown")

    def request_force_stop(self, signum, frame) -> None:
        """Second SIGTERM/SIGINT: requeue the current job now and exit."""
        since = rqadapter.shutdown_requested_for(self)
        if since is not None and since.total_seconds() < 1:
            return
        if self.get_state() != WorkerStatus.BUSY:
            raise SystemExit()
        log.warning("worker.stopping_now", then="requeue the job")
        self._interrupt("shutdown")

    # -- heartbeat thread and maintenance ----------------------------------------------------------
    def bootstrap(self, *args, **kwargs) -> None:
        super().bootstrap(*args, **kwargs)
        signal.signal(INTERRUPT_SIGNAL, self._on_interrupt_signal)  # the heartbeat thread's interrupts
        self._beat_thread = threading.Thread(target=self._beat_loop, name="decodebench-heartbeat", daemon=True)
        self._beat_thread.start()

    def teardown(self) -> None:
        self._beat_stop.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=5)
        super().teardown()

    def _beat_loop(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the main thread's to handle
        next_maintenance = 0.0
        while True:
            touch(self.heartbeat_file)
            try:
                self._beat()
                if time.monotonic() >= next_maintenance:
                    next_maintenance = time.monotonic() + self.timing.reaper_interval
                    self.maintain()
            except RedisError as err:  # Redis restarting: RQ's main loop backs off; we retry next beat
                log.warning("worker.redis_unavailable", error=str(err))
            except Exception:
                log.exception("worker.heartbeat_error")
            if self._beat_stop.wait(self.timing.beat):
                return

    def _beat(self) -> None:
        current = self._current
        if current is None:
            return
        job, execution, ids, tenant = current
        self.maintain_heartbeats(job, execution)
        slots.extend_slot(self.connection, tenant, job.id, self.timing.heartbeat_ttl)
        slots.extend_run(self.connection, tenant, job.id, self.name, self.timing.heartbeat_ttl)
        if ids is None:
            return
        sweepstate.heartbeat_job(self.connection, *ids, self.timing.heartbeat_ttl)
        tenant, sweep_id = ids[0], ids[1]
        if self._pending:  # the job was busy in non-interruptible code: ask again
            os.kill(os.getpid(), INTERRUPT_SIGNAL)
        elif sweepstate.is_cancelled(self.connection, tenant, sweep_id):
            log.info("job.cancelling", job_id=job.id, sweep_id=sweep_id)
            self._interrupt("cancel")
        elif self._stop_deadline is not None and time.monotonic() > self._stop_deadline:
            self._interrupt("shutdown")

    def maintain(self) -> None:
        """Every reaper interval, busy or idle: a changed tenants file, new tenants, lost jobs, due retries."""
        reload_tenants(self)
        self.refresh_queues()
        requeued = reap(self.connection, self.tenants, self.timing)
        if requeued:
            log.warning("worker.requeued_lost_jobs", jobs=requeued)
        enqueue_due_retries(self.connection, self.queues)

    def run_maintenance_tasks(self) -> None:
        reap(self.connection, self.tenants, self.timing)  # before RQ's own abandoned-job cleanup
        super().run_maintenance_tasks()
