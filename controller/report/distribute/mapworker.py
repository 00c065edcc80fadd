"""`decodebench report-worker`: runs the report cells, pairs and judge shares (map jobs) of the tenants' report queues.

A controller process (it imports the metric code, which the GPU worker never does) built on the
same RQ adapter as `decodebench-worker`: RQ's fork-less worker as the adapter hooks it
(`worker.core.rqadapter.worker.HookedWorker`), with this module's `ReportLogic` injected. It takes
only report queues (`decodebench.<tenant>.report`, `worker.core.keys.report_queue`), which no GPU
worker takes, and runs a job only where:

- its payload carries the signing key's signature for its tenant and job id, checked before a byte
  is inflated, and inflated under DECODEBENCH_MAX_JOB_MB (`rqadapter.job.sealed_refusal`, the code
  the GPU worker runs);
- it calls the report function (`keys.REPORT_FUNCTION`; the adapter's job class calls nothing else
  for a job of a report queue) with one payload for the queue's own tenant
  (`controller.report.distribute.worker.check_payload`).

A refused job fails for good with its one-line reason in RQ's meta; the controller that waits for
it computes that cell itself. The job reads the worker's own store (lent, never a URL from the
payload). A worker killed mid-cell leaves the cell to the controller (RQ's maintenance fails the
abandoned job; a cell is cheap to recompute). No slots, quotas or sweep state: a report job is
CPU work of a minute, not a GPU job.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import structlog

from controller.report.distribute.worker import check_payload, lend_store
from worker.core import keys
from worker.core.errors import UsageError
from worker.core.rqadapter import SERIALIZER, DeserializationError
from worker.core.rqadapter.job import sealed_refusal
from worker.core.rqadapter.logic import WorkerLogic
from worker.core.rqadapter.queue import ReliableQueue, known_queue_names
from worker.core.rqadapter.worker import HookedWorker
from worker.sweepstate import slots

log = structlog.get_logger("decodebench.report_worker")


def report_worker(selectors: list[str], *, connection, store, key: bytes, max_job_bytes: int, **options):
    """The report worker of `selectors` (tenants, or `*` for every tenant's report queue)."""
    own = ("beat_s", "heartbeat_ttl", "reaper_interval", "stop_grace", "declared", "heartbeat_file")
    own = {k: options.pop(k) for k in own if k in options}
    logic = ReportLogic(selectors, store, key=key, max_job_bytes=max_job_bytes, **own)
    host = socket.gethostname().split(".")[0]
    name = options.pop("name", None) or f"decodebench-report-{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return HookedWorker(logic, name=name, connection=connection, **options)


class ReportLogic(WorkerLogic):
    """What the report worker does at RQ's hooks (`worker.core.rqadapter.logic.WorkerLogic`: its
    defaults for the rest: round robin, refused jobs failed for good, nothing to cancel or reap)."""

    log_name, stopped_event = "decodebench.report_worker", "report_worker.stopped"

    def __init__(
        self,
        selectors: list[str],
        store,
        *,
        key: bytes,
        max_job_bytes: int,
        beat_s: float = 10.0,
        heartbeat_ttl: float = 60.0,
        reaper_interval: float = 15.0,
        stop_grace: float | None = None,
        declared: list[str] | None = None,
        heartbeat_file: str | None = None,
    ) -> None:
        """`declared`: the tenants file's tenants (None: no tenants file). With one, `*` is the declared
        tenants and another tenant is refused at start; without one, `*` is every report queue in RQ's
        queue set, re-read every reaper interval. `heartbeat_file`: touched every beat, busy or idle
        (the chart's probes read it)."""
        self.selectors = [p.strip() for s in selectors for p in s.split(",") if p.strip()]
        if not self.selectors:
            raise UsageError("TENANT: no tenant given (or '*')")
        self.wildcard = "*" in self.selectors and declared is None
        if "*" in self.selectors and declared is not None:
            self.selectors = [*(s for s in self.selectors if s != "*"), *declared]
        for s in self.selectors:
            if s == "*":
                continue
            try:
                keys.report_queue(s)
            except ValueError as err:
                raise UsageError(f"TENANT: {err}") from None
            if declared is not None and s not in declared:
                raise UsageError(f"TENANT: tenant {s!r} is not declared in the tenants file")
        self.store, self.key, self.max_job_bytes = store, key, max_job_bytes
        self.beat_s, self.heartbeat_ttl = beat_s, heartbeat_ttl
        self.reaper_interval, self.stop_grace = reaper_interval, stop_grace
        self.heartbeat_file = heartbeat_file
        self.active = threading.Event()

    def attach(self, worker: HookedWorker) -> None:
        super().attach(worker)
        self._set_queues([keys.report_queue(s) for s in self.selectors if s != "*"])

    def _set_queues(self, names: list[str]) -> None:
        queues = [ReliableQueue(n, connection=self.connection, serializer=SERIALIZER) for n in sorted(set(names))]
        self.worker.set_queues(queues, list(queues))

    def refresh_queues(self) -> None:
        if not self.wildcard:
            return
        known = {q.name for q in self.worker.queues}
        found = {n for n in known_queue_names(self.connection) if keys.parse_report_queue(n)} - known
        if found:
            self._set_queues([*known, *found])
            log.info("report_worker.queues", added=sorted(found))

    # -- running a job ---------------------------------------------------------------------------
    def claim(self, job_id: str, tenant: str, status: str | None) -> str | None:
        return slots.claim_run(self.connection, tenant, job_id, self.worker.name, self.heartbeat_ttl, status)

    def release(self, job_id: str, tenant: str) -> None:
        slots.release_run(self.connection, tenant, job_id, self.worker.name)

    def refusal(self, job, tenant: str) -> str | None:
        why = sealed_refusal(job, self.key, self.max_job_bytes) or _call_refusal(job, tenant)
        if why:
            log.warning("job.refused", job_id=job.id, tenant=tenant, reason=why)
        return why

    @contextlib.contextmanager
    def running(self, job, tenant: str, refused: bool) -> Iterator[None]:
        started = time.monotonic()
        with lend_store(self.store):
            self.active.set()
            try:
                yield None
            finally:
                self.active.clear()
        took = round(time.monotonic() - started, 2)
        log.info("report_worker.job", job_id=job.id, tenant=tenant, refused=refused, s=took)

    def in_job_code(self) -> bool:
        return self.active.is_set()

    # -- every beat, and maintenance -------------------------------------------------------------
    def beat(self, job_id: str, tenant: str, ref) -> None:
        slots.extend_run(self.connection, tenant, job_id, self.worker.name, self.heartbeat_ttl)


def _call_refusal(job, tenant: str) -> str | None:
    """Why a job of `tenant`'s report queue, its signature checked, must not run; None if it may."""
    try:
        func, args, kwargs = job.func_name, job.args, job.kwargs
    except DeserializationError:
        return "refused: the job's payload is not readable JSON"
    if func != keys.REPORT_FUNCTION:
        return f"refused: the job calls {str(func)[:80]!r}, not {keys.REPORT_FUNCTION}"
    if job.instance is not None or kwargs or not isinstance(args, (list, tuple)) or len(args) != 1:
        return "refused: the job's arguments are not one report cell"
    return check_payload(args[0], tenant)
