"""Prometheus metrics of one worker process (prometheus-client), served on DECODEBENCH_METRICS_PORT.

Each process of a pod serves its own /metrics (the chart gives process i the port base + i), so a
crashed process's restart shows as a new `process_start_time_seconds` of its own series. Names
follow Prometheus's conventions (base units, `_total` counters); labels are bounded: the pool
(DECODEBENCH_POOL), the tenant (the queue's, a declared name), the strategy (a registered name,
else `other`: the payload is the tenant's word), the engine (decodebench or vllm, else `other`) and
the device, never a job or sweep id.

    decodebench_worker_jobs_started_total{pool,tenant,strategy,engine}        jobs taken and started
    decodebench_worker_jobs_finished_total{pool,tenant,strategy,engine}       ... that finished (done)
    decodebench_worker_jobs_failed_total{pool,tenant,strategy,engine}         ... that failed (refusals, retries too)
    decodebench_worker_jobs_interrupted_total{pool,tenant,strategy,engine}    ... cancelled, or requeued by a shutdown
    decodebench_worker_job_duration_seconds{pool,tenant,strategy,engine}      histogram: wall time of a job
    decodebench_worker_queue_wait_seconds{pool,tenant}                 histogram: enqueue (or retry) to start
    decodebench_worker_generated_tokens_total{pool,tenant,strategy,engine}    new tokens of finished jobs
    decodebench_worker_job_tokens_per_second{pool,tenant,strategy,engine}     histogram: tokens / wall s
    decodebench_worker_busy{pool}                                      1 while a job runs
    decodebench_worker_gpu_memory_bytes{pool,device,kind}              torch's allocated, reserved, peak (CUDA only)
    decodebench_queue_jobs{pool,tenant,state}                          waiting, running, scheduled, read at scrape
    process_*                                                          prometheus-client's process collector

`decodebench_queue_jobs` is the same for every worker of a tenant: aggregate it with max, not sum.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import GaugeMetricFamily

from worker.core import rqadapter, settings
from worker.core.rqadapter import Status
from worker.core.rqadapter.job import return_value

log = structlog.get_logger("decodebench.worker")
JOB_LABELS = ("pool", "tenant", "strategy", "engine")
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
WAIT_BUCKETS = (0.1, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
INTERRUPTED = (Status.STOPPED, Status.CANCELED, Status.QUEUED)


def strategy_of(job) -> str:
    """The job's strategy name if it is a registered one, else `other` (bounded label values)."""
    from worker.strategies import STRATEGIES

    try:
        name = job.args[0]["strategy"]["name"]
    except Exception:
        return "other"
    return name if isinstance(name, str) and name in STRATEGIES else "other"


def engine_of(job) -> str:
    """The job's engine name (the own engine where the payload names none), else `other`."""
    from worker.core.engines import ENGINE_NAMES, OWN_ENGINE

    try:
        engine = job.args[0].get("engine") or {}
        name = engine.get("name", OWN_ENGINE) if isinstance(engine, dict) else "other"
    except Exception:
        return "other"
    return name if name in ENGINE_NAMES else "other"


class QueueCollector:
    """decodebench_queue_jobs: the worker's tenants' waiting, running and scheduled jobs, at scrape."""

    def __init__(self, worker, pool: str) -> None:
        self.worker, self.pool = worker, pool

    def collect(self):
        family = GaugeMetricFamily(
            "decodebench_queue_jobs",
            "Jobs of a tenant's queues by state, as Redis holds them.",
            labels=["pool", "tenant", "state"],
        )
        try:
            counts = self._counts()
        except Exception as err:  # Redis unavailable: no sample rather than a failed scrape
            log.warning("worker.metrics_queue_error", error=str(err))
            counts = {}
        for (tenant, state), n in sorted(counts.items()):
            family.add_metric([self.pool, tenant, state], n)
        yield family

    def _counts(self) -> dict[tuple[str, str], int]:
        return rqadapter.tenant_job_counts(self.worker.connection, [q.name for q in list(self.worker.queues)])


class WorkerMetrics:
    """The metrics of one worker process, in a registry of its own."""

    def __init__(self, worker=None, pool: str | None = None, device: str = "cpu") -> None:
        self.pool = pool or settings.get("pool") or "default"
        self.device = device
        self.registry = reg = CollectorRegistry()
        ProcessCollector(registry=reg)
        name = "decodebench_worker_"
        self.started = Counter(name + "jobs_started", "Jobs taken and started.", JOB_LABELS, registry=reg)
        self.finished = Counter(name + "jobs_finished", "Jobs that finished (done).", JOB_LABELS, registry=reg)
        self.failed = Counter(
            name + "jobs_failed", "Jobs that failed (refused, or to be retried).", JOB_LABELS, registry=reg
        )
        self.interrupted = Counter(
            name + "jobs_interrupted", "Jobs cancelled, or requeued by a shutdown.", JOB_LABELS, registry=reg
        )
        self.duration = Histogram(
            name + "job_duration_seconds", "Wall time of a job.", JOB_LABELS, buckets=DURATION_BUCKETS, registry=reg
        )
        self.wait = Histogram(
            name + "queue_wait_seconds",
            "Enqueue (or retry) to start.",
            ("pool", "tenant"),
            buckets=WAIT_BUCKETS,
            registry=reg,
        )
        self.tokens = Counter(name + "generated_tokens", "New tokens of finished jobs.", JOB_LABELS, registry=reg)
        self.rate = Histogram(
            name + "job_tokens_per_second", "A finished job's new tokens per wall second.", JOB_LABELS,
            buckets=RATE_BUCKETS, registry=reg,
        )  # fmt: skip
        self.busy = Gauge(name + "busy", "1 while a job runs.", ("pool",), registry=reg)
        self.busy.labels(self.pool).set(0)
        memory = Gauge(name + "gpu_memory_bytes", "torch's CUDA memory.", ("pool", "device", "kind"), registry=reg)
        for kind in ("allocated", "reserved", "peak"):
            memory.labels(self.pool, device, kind).set_function(lambda kind=kind: self.gpu_memory(kind))
        if worker is not None:
            reg.register(QueueCollector(worker, self.pool))

    def gpu_memory(self, kind: str) -> float:
        torch = sys.modules.get("torch")  # loaded by the engine: never imported here
        if torch is None or not self.device.startswith("cuda") or not torch.cuda.is_initialized():
            return 0.0
        read = {
            "allocated": torch.cuda.memory_allocated,
            "reserved": torch.cuda.memory_reserved,
            "peak": torch.cuda.max_memory_allocated,
        }[kind]
        return float(read(self.device))

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
        log.info("worker.metrics", port=port, path="/metrics")

    @contextmanager
    def job(self, job, tenant: str, refused: bool) -> Iterator[None]:
        """Count one job around RQ's perform_job: started, then its outcome as RQ recorded it."""
        labels = (self.pool, tenant, strategy_of(job), engine_of(job))
        self.started.labels(*labels).inc()
        enqueued = job.enqueued_at
        if enqueued is not None:
            enqueued = enqueued if enqueued.tzinfo else enqueued.replace(tzinfo=UTC)
            wait = (datetime.now(UTC) - enqueued).total_seconds()
            self.wait.labels(self.pool, tenant).observe(max(wait, 0.0))
        self.busy.labels(self.pool).set(1)
        start = time.monotonic()
        try:
            yield
        finally:
            self.busy.labels(self.pool).set(0)
            self._outcome(job, labels, time.monotonic() - start, refused)

    def _outcome(self, job, labels: tuple[str, ...], seconds: float, refused: bool) -> None:
        self.duration.labels(*labels).observe(seconds)
        try:
            status = None if refused else job.get_status(refresh=True)
        except Exception:
            status = None
        if status == Status.FINISHED:
            self.finished.labels(*labels).inc()
            result = return_value(job)
            tokens = int(result.get("new_tokens", 0) or 0) if isinstance(result, dict) else 0
            self.tokens.labels(*labels).inc(tokens)
            if tokens and seconds > 0:
                self.rate.labels(*labels).observe(tokens / seconds)
        elif status in INTERRUPTED:
            self.interrupted.labels(*labels).inc()
        else:
            self.failed.labels(*labels).inc()


def worker_metrics(worker, device: str) -> WorkerMetrics:
    """The worker's metrics; served over HTTP when DECODEBENCH_METRICS_PORT is set."""
    metrics = WorkerMetrics(worker, device=device)
    port = int(settings.get("metrics_port") or 0)
    if port:
        metrics.serve(port)
    return metrics
