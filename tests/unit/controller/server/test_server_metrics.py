"""The submission server's Prometheus metrics (controller/server/metrics.py), from a real
`decodebench serve --metrics-port` on loopback with a real Redis: answers by route template and
code, latency, auth failures, quota refusals by tenant, and every tenant's queue depth read from
Redis at scrape (docs/deploy.md, "Metrics and alerts")."""

from __future__ import annotations

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server import deployment
from tests.support.services import free_port
from worker.core import keys

TENANTS = "tenants:\n  - {{name: team-a}}\n  - {{name: team-b, rate_limit: 2}}\n"


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_the_server_counts_its_answers_refusals_and_queues(tmp_path, redis_url, signing_key_file, tiny_model):
    port = free_port()
    extra = {"DECODEBENCH_METRICS_PORT": str(port)}
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=TENANTS, **extra) as dep:
        with dep.client("alice") as alice, dep.client("bob") as bob:
            assert alice.get("/v1/whoami").status_code == 200
            assert alice.get("/v1/sweeps/0123456789abcdef").status_code == 404
            assert alice.get("/v1/sweeps/fedcba9876543210").status_code == 404
            assert alice.get("/no/such/route").status_code == 404
            assert [bob.get("/v1/sweeps").status_code for _ in range(3)] == [200, 200, 429]
        assert httpx.get(f"{dep.url}/v1/whoami", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(f"{dep.url}/v1/whoami").status_code == 401

        # what RQ holds for team-a: 2 jobs waiting on the own engine, 1 on vLLM's queue, 1 running
        conn = redis.Redis.from_url(redis_url)
        own, vllm = keys.queue_name("team-a"), keys.queue_name("team-a", engine="vllm")
        conn.sadd(keys.RQ_QUEUES, keys.rq_queue_key(own), keys.rq_queue_key(vllm))
        conn.rpush(keys.rq_queue_key(own), "j1", "j2")
        conn.rpush(keys.rq_queue_key(vllm), "j3")
        conn.zadd(keys.rq_registry_key("wip", own), {"j0": 1})

        got = scrape(port)
    requests = "decodebench_server_requests_total"
    assert value(got, requests, route="/v1/whoami", method="GET", code="200") == 1
    # the route's template, never the client's path: a client cannot grow the series
    assert value(got, requests, route="/v1/sweeps/{sweep}", method="GET", code="404") == 2
    assert value(got, requests, route="other", method="GET", code="404") == 1
    assert value(got, requests, route="/v1/sweeps", method="GET", code="429") == 1
    assert value(got, requests, route="/v1/whoami", method="GET", code="401") == 2
    assert not [k for k in got if "0123456789abcdef" in str(k)]
    assert value(got, "decodebench_server_auth_failures_total") == 2
    assert value(got, "decodebench_server_quota_refusals_total", tenant="team-b") == 1
    assert value(got, "decodebench_server_request_duration_seconds_count", route="/v1/sweeps") == 3
    assert value(got, "decodebench_server_request_duration_seconds_bucket", route="/v1/sweeps", le="+Inf") == 3
    queue = "decodebench_server_queue_jobs"
    assert value(got, queue, tenant="team-a", engine="decodebench", state="waiting") == 2
    assert value(got, queue, tenant="team-a", engine="vllm", state="waiting") == 1
    assert value(got, queue, tenant="team-a", engine="decodebench", state="running") == 1


def test_the_metrics_are_not_on_the_api_port(tmp_path, redis_url, signing_key_file, tiny_model):
    extra = {"DECODEBENCH_METRICS_PORT": str(free_port())}
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, **extra) as dep:
        assert httpx.get(f"{dep.url}/metrics").status_code == 404  # not behind the Ingress with the API
