"""The RQ worker of decodebench: one process, one pinned device, one engine, jobs run in-process.

`decodebench_worker(...)` builds RQ's worker as the adapter hooks it (`worker.core.rqadapter.worker`:
`HookedWorker`, RQ's `SimpleWorker`, no fork: CUDA is initialised once and the model cache survives
across jobs) with decodebench's logic injected: `DecodebenchLogic`, a plain class that never sees RQ.

- weighted fair share across tenants (`worker.rq.fair`: stride scheduling by the tenants file's
  weights), high before normal before low inside a tenant, a tenant's `max_running` held across
  workers (`worker.sweepstate.slots`); a job id taken twice runs once (its run lock);
- it takes only its engine's queues (`worker.core.keys`), and a job of another engine fails for good;
- a job is run only if its payload carries the submission server's signature for its tenant and id
  (checked before a byte is inflated, inflated under DECODEBENCH_MAX_JOB_MB), calls decodebench's task
  for the tenant of the queue it came from, and passes the tenant's policy and the per-job limits
  (`worker.core.policy`); nothing else of the job hash is obeyed (`worker.rq.sealed`); with a tenants
  file, only declared tenants are served, and a changed file is taken between jobs (`worker.rq.reload`);
- the job runs with the worker's own store and runtime, lent to `run_queued_job` (`worker.rq.task.lend`);
- every beat, busy or idle, the liveness file is touched (`worker.core.liveness`); while a job runs its
  run lock, slot and sweep heartbeat are kept fresh with a short TTL, and a cancelled sweep interrupts
  it; every reaper interval the reaper (`worker.rq.reaper.reap`) and due retries run;
- SIGTERM: a busy worker finishes the current job within `stop_grace` (default its own timeout), else
  it is requeued at the front (the adapter's hooks); the last line is `worker.stopped`."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterator

import structlog

from worker import sweepstate
from worker.core import keys, settings
from worker.core.contract import JobRef
from worker.core.engines import OWN_ENGINE
from worker.core.errors import UsageError
from worker.core.liveness import touch
from worker.core.policy import Limits
from worker.core.rqadapter.logic import WorkerLogic
from worker.core.rqadapter.queue import ReliableQueue
from worker.core.rqadapter.worker import HookedWorker
from worker.core.tenants import TenantsFile, load_tenants
from worker.rq.fair import FairShare
from worker.rq.metrics import worker_metrics
from worker.rq.queues import discover_queue_names, fair_order, resolve_queue_names, tenant_queue, work_may_come_back
from worker.rq.reaper import Timing, enqueue_due_retries, reap
from worker.rq.reload import TenantsReload, reload_tenants
from worker.rq.sealed import sealed_refusal, signing_key
from worker.rq.task import Lent, fail_unrunnable, job_ref, lend, refusal
from worker.sweepstate import slots

__all__ = ["DecodebenchLogic", "ReliableQueue", "decodebench_worker", "touch"]
log = structlog.get_logger("decodebench.worker")


def decodebench_worker(
    selectors: list[str],
    *,
    connection,
    store,
    runtime,
    name: str | None = None,
    **options,
) -> HookedWorker:
    """The worker of `selectors` (tenants, queue names, `*`). `store`, `runtime` (worker.engine.job.Runtime):
    lent to every job. `name`: RQ's worker name (default: host, pid, device). `options`: `DecodebenchLogic`'s,
    and any of RQ's worker (`worker_ttl`, ...)."""
    own = {k: options.pop(k) for k in DecodebenchLogic.OPTIONS if k in options}
    logic = DecodebenchLogic(selectors, connection, Lent(store=store, runtime=runtime), **own)
    device = str(runtime.device).replace(":", "")
    host = socket.gethostname().split(".")[0]
    name = name or f"decodebench-{host}-{os.getpid()}-{device}-{uuid.uuid4().hex[:6]}"
    return HookedWorker(logic, name=name, connection=connection, **options)


class DecodebenchLogic(WorkerLogic):
    """What the worker does at RQ's hooks (`worker.core.rqadapter.logic.WorkerLogic`)."""

    OPTIONS = ("timing", "stop_grace", "tenants", "tenants_file", "heartbeat_file", "key", "limits")
    OPTIONS += ("max_job_bytes", "engine")

    def __init__(
        self,
        selectors: list[str],
        connection,
        lent: Lent,
        *,
        timing: Timing | None = None,
        stop_grace: float | None = None,
        tenants: TenantsFile | None = None,
        tenants_file: str | None = None,
        heartbeat_file: str | None = None,
        key: bytes | None = None,
        limits: Limits | None = None,
        max_job_bytes: int | None = None,
        engine: str = OWN_ENGINE,
    ) -> None:
        """`tenants` (weights, quotas, models), or `tenants_file`, watched; neither: every tenant.
        `heartbeat_file`: touched every beat (the pod's probes read it, charts/decodebench). `key`,
        `limits`, `max_job_bytes`: signatures, per-job cost, payload size (settings' if None).
        `engine`: the one engine the worker runs, whose queues alone it takes."""
        self.signing_key = key or signing_key()
        self.limits = limits or Limits.from_settings()
        self.max_job_bytes = max_job_bytes or int(settings.get("max_job_mb")) * 2**20
        self.timing = timing or Timing.from_settings()
        self.beat_s, self.heartbeat_ttl = self.timing.beat, self.timing.heartbeat_ttl
        self.reaper_interval = self.timing.reaper_interval
        path = tenants_file if tenants is None else None
        self.tenant_file = tenants if tenants is not None else (load_tenants(path) if path else None)
        self.tenants_reload = TenantsReload(path, self.tenant_file) if path else None
        weights = {t.name: t.weight for t in self.tenant_file.tenants} if self.tenant_file else None
        self.fair = FairShare(weights=weights or {})
        self.lent = lent
        self.stop_grace, self.selectors, self.engine = stop_grace, selectors, engine
        declared = None if weights is None else list(weights)
        self._names, self.wildcard = resolve_queue_names(connection, selectors, declared, engine)
        if not self._names and not self.wildcard:
            raise UsageError("--queues: no queue given")
        self.heartbeat_file = heartbeat_file
        self.worker: HookedWorker | None = None

    def attach(self, worker: HookedWorker) -> None:
        super().attach(worker)
        self._set_queues(self._names)
        self.metrics = worker_metrics(self, str(self.lent.runtime.device))  # on DECODEBENCH_METRICS_PORT, if set

    # -- what reload and metrics read of the worker --------------------------------------------------
    @property
    def key(self) -> str:
        return self.worker.key

    @property
    def queues(self) -> list[ReliableQueue]:
        return self.worker.queues

    @queues.setter
    def queues(self, queues: list[ReliableQueue]) -> None:
        self.worker.queues = queues

    def queue_names(self) -> list[str]:
        return self.worker.queue_names()

    # -- queues and fairness -----------------------------------------------------------------
    def _policy(self, tenant: str):
        return self.tenant_file.get(tenant) if self.tenant_file else None

    def _set_queues(self, names: list[str]) -> None:
        by_name = {q.name: q for q in self.worker.queues}
        for n in names:
            if n not in by_name:
                tenant = keys.parse_queue_name(n)[0]
                policy = self._policy(tenant)
                max_running = policy.max_running if policy else None
                by_name[n] = tenant_queue(self.connection, n, max_running, self.heartbeat_ttl)
                self.fair.add(tenant)
        order = fair_order(list(by_name), self.fair.order(), self.engine)
        self.worker.set_queues([by_name[n] for n in sorted(by_name)], [by_name[n] for n in order])

    def dequeued_from(self, queue: ReliableQueue) -> None:
        """After a dequeue from tenant T: charge T, and the tenants tried before it had nothing."""
        parsed = keys.parse_queue_name(queue.name)
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

    def work_may_come_back(self) -> bool:
        return work_may_come_back(self.connection, self.tenants, self.queues)

    # -- running a job ---------------------------------------------------------------------------
    def claim(self, job_id: str, tenant: str, status: str | None) -> str | None:
        return slots.claim_run(self.connection, tenant, job_id, self.worker.name, self.heartbeat_ttl, status)

    def release(self, job_id: str, tenant: str) -> None:
        slots.release_run(self.connection, tenant, job_id, self.worker.name)

    def held_back(self, tenant: str) -> str | None:
        """A tenant the tenants file no longer declares (removed while a dequeue over its queue waited):
        its jobs stay queued, as those the worker no longer dequeues (`worker.rq.reload`)."""
        if self.tenant_file is not None and self.tenant_file.get(tenant) is None:
            return f"tenant {tenant} is not declared in the tenants file"
        return None

    def refusal(self, job, tenant: str) -> str | None:
        self.lent.tenant = tenant
        why = sealed_refusal(job, self.signing_key, self.max_job_bytes) or refusal(
            job, tenant, self.tenant_file, self.limits, self.engine
        )
        if why:
            log.warning("job.refused", job_id=job.id, tenant=tenant, reason=why)
        return why

    def fail_refused(self, job, why: str) -> None:
        fail_unrunnable(job, self.lent.tenant, why)

    @contextlib.contextmanager
    def running(self, job, tenant: str, refused: bool) -> Iterator[JobRef | None]:
        ref = None if refused else job_ref(job)
        if ref:
            sweepstate.heartbeat_job(self.connection, *ref, self.heartbeat_ttl, create=True)
        started = time.time()
        try:
            with lend(self.lent), self.metrics.job(job, tenant, refused=refused):
                yield ref
        finally:
            slots.release_slot(self.connection, tenant, job.id)
            if ref:
                sweepstate.forget_job(self.connection, *ref)
                slots.record_usage(self.connection, tenant, job.id, started, time.time())

    def in_job_code(self) -> bool:
        return self.lent.active.is_set()

    # -- every beat, and maintenance -------------------------------------------------------------
    def beat(self, job_id: str, tenant: str, ref: JobRef | None) -> None:
        slots.extend_slot(self.connection, tenant, job_id, self.heartbeat_ttl)
        slots.extend_run(self.connection, tenant, job_id, self.worker.name, self.heartbeat_ttl)
        if ref is not None:
            sweepstate.heartbeat_job(self.connection, *ref, self.heartbeat_ttl)

    def cancelled(self, ref: JobRef) -> bool:
        return sweepstate.is_cancelled(self.connection, ref.tenant, ref.sweep_id)

    def maintain(self) -> None:
        """Every reaper interval, busy or idle: a changed tenants file, new tenants, lost jobs, due retries."""
        reload_tenants(self)
        self.refresh_queues()
        requeued = reap(self.connection, self.reaped_tenants(), self.timing)
        if requeued:
            log.warning("worker.requeued_lost_jobs", jobs=requeued)
        enqueue_due_retries(self.connection, self.queues)

    def reap(self) -> None:
        reap(self.connection, self.reaped_tenants(), self.timing)

    def reaped_tenants(self) -> list[str]:
        """The tenants whose lost jobs this worker requeues: every tenant with a queue, not only those it serves. A
        pool of one tenant scaled to zero would never find its own lost jobs (they are in no queue, so nothing
        scales it up again); requeued by any worker, they are, and the pool wakes for them."""
        return sorted(set(self.tenants) | set(sweepstate.known_tenants(self.connection)))
