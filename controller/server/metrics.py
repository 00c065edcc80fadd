"""The submission server's Prometheus metrics (`decodebench serve --metrics-port`, docs/deploy.md,
"Metrics and alerts"), on a port of their own: never behind the Ingress with the API.

    decodebench_server_requests_total{route,method,code}        every answer, by route template
    decodebench_server_request_duration_seconds{route}          latency histogram
    decodebench_server_auth_failures_total                      401s: no, unknown or revoked token
    decodebench_server_quota_refusals_total{tenant}             429s: rate limit and quotas
    decodebench_server_queue_jobs{tenant,engine,state}          waiting, running, scheduled; read at scrape

`route` is the matched route's template (/v1/sweeps/{sweep}), `other` for a path no route has: a
client cannot grow the series. The middleware wraps the whole app, so that a request the server
refuses before any route (a bad token, the rate limit) is counted too.
"""

from __future__ import annotations

import time

import structlog
from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from worker.core import rqadapter

log = structlog.get_logger("decodebench.server")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class QueueDepth:
    """decodebench_server_queue_jobs: every tenant's jobs by state, as Redis holds them, at scrape."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def collect(self):
        family = GaugeMetricFamily(
            "decodebench_server_queue_jobs",
            "Jobs of a tenant's queues by engine and state.",
            labels=["tenant", "engine", "state"],
        )
        try:
            counts = rqadapter.tenant_job_counts(self.conn, by_engine=True)
        except Exception as err:  # Redis unavailable: no sample rather than a failed scrape
            log.warning("server.metrics_queue_error", error=str(err)[:200])
            counts = {}
        for labels, n in sorted(counts.items()):
            family.add_metric(list(labels), n)
        yield family


class ServerMetrics:
    """The server's metrics, in a registry of their own."""

    def __init__(self, conn=None) -> None:
        self.registry = reg = CollectorRegistry()
        name = "decodebench_server_"
        self.requests = Counter(name + "requests", "Answers by route, method and code.", ("route", "method", "code"),
                                registry=reg)  # fmt: skip
        self.latency = Histogram(name + "request_duration_seconds", "Time to answer.", ("route",),
                                 buckets=LATENCY_BUCKETS, registry=reg)  # fmt: skip
        self.auth_failures = Counter(name + "auth_failures", "Requests refused for their token (401).", registry=reg)
        self.quota_refusals = Counter(
            name + "quota_refusals", "Requests refused by a rate limit or quota (429).", ("tenant",), registry=reg
        )
        if conn is not None:
            reg.register(QueueDepth(conn))

    def observe(self, request: Request, code: int, seconds: float) -> None:
        route = getattr(request.scope.get("route"), "path", None) or "other"
        self.requests.labels(route, request.method, str(code)).inc()
        self.latency.labels(route).observe(seconds)
        if code == 401:
            self.auth_failures.inc()
        elif code == 429:
            who = getattr(request.state, "who", None)
            self.quota_refusals.labels(getattr(who, "tenant", None) or "").inc()

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)
        log.info("server.metrics", port=port, path="/metrics")


def instrument(app: FastAPI, metrics: ServerMetrics) -> None:
    """Count and time every answer of `app` (its outermost middleware)."""

    async def measure(request: Request, call_next):
        started = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception:
            metrics.observe(request, 500, time.perf_counter() - started)
            raise
        metrics.observe(request, response.status_code, time.perf_counter() - started)
        return response

    app.middleware("http")(measure)
    app.state.metrics = metrics
