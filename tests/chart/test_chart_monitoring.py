"""The chart's Prometheus pieces, rendered with the real helm and checked offline: PodMonitor,
ServiceMonitor and PrometheusRule against prometheus-operator's own CRD schemas (openAPIV3Schema of
monitoring.coreos.com v1, vendored in tests/chart/schemas/prometheus-operator, see their $comment, made
strict as the API server's field validation is), the ports they scrape against the pods' ports,
and the alerts' metric names against what the worker's metrics module exports."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.support.chart import CHART_TESTS, _strict, find, render, render_error, workers
from worker.rq.metrics import WorkerMetrics

SCHEMA_DIR = CHART_TESTS / "schemas" / "prometheus-operator"
# Go's RE2 takes a flag group after `^` (PrometheusRule's partial_response_strategy); Python wants it first.
SCHEMAS = {p.stem: _strict(json.loads(p.read_text().replace('"^(?i)', '"(?i)^'))) for p in SCHEMA_DIR.glob("*.json")}
ALL_ON = {
    "metrics": {
        "enabled": True,
        "labels": {"release": "kube-prometheus-stack"},
        "allowedFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "podMonitor": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    },
    "redis": {"metrics": {"enabled": True}},
    "worker": {"pools": [{"name": "h100", "gpus": 4}, {"name": "cpu", "gpus": 0}]},
}
# Metric names the alerts may use from elsewhere: kube-state-metrics and redis_exporter.
OUTSIDE = {"kube_pod_container_status_restarts_total", "redis_memory_used_bytes", "redis_memory_max_bytes"}


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(ALL_ON)


def test_the_monitoring_objects_fit_prometheus_operators_crd_schemas(docs):
    kinds = [d["kind"] for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1"]
    assert sorted(kinds) == ["PodMonitor", "PodMonitor", "PrometheusRule", "ServiceMonitor"]
    for doc in docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            jsonschema.validate(doc, SCHEMAS[doc["kind"]])
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # what Prometheus selects
    bad = find(docs, "PodMonitor")[0] | {"spec": {"podMetricsEndpoints": [{"port": "metrics-0", "bogus": 1}]}}
    with pytest.raises(jsonschema.ValidationError):  # the strict schemas do catch a stray field
        jsonschema.validate(bad, SCHEMAS["PodMonitor"])


def test_each_pool_is_scraped_on_one_port_per_worker_process(docs):
    pools = workers(docs)
    for monitor in find(docs, "PodMonitor"):
        pool = monitor["metadata"]["labels"]["decodebench.io/pool"]
        pod = pools[pool]["spec"]["template"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        (container,) = pod["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == sorted(ports)
        assert ports == {f"metrics-{i}": 9400 + i for i in range({"h100": 4, "cpu": 1}[pool])}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["DECODEBENCH_METRICS_PORT"] == "9400"  # the launcher adds the process index
    (policy,) = find(docs, "NetworkPolicy", "db-decodebench-worker")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9400, "endPort": 9403}]
    assert rule["from"] == ALL_ON["metrics"]["allowedFrom"]
    (monitor,) = find(docs, "ServiceMonitor")
    (svc,) = [s for s in find(docs, "Service") if "metrics" in {p["name"] for p in s["spec"]["ports"]}]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


def exported_names() -> set[str]:
    """Sample names the worker's metrics module exports (decodebench_queue_jobs: collected from
    Redis at scrape, tests/unit/worker/rq/test_worker_metrics.py)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    families = WorkerMetrics(pool="p").registry.collect()
    return {f.name + suffix for f in families for suffix in suffixes.get(f.type, ("",))} | {"decodebench_queue_jobs"}


def test_the_alerts_use_the_metrics_the_worker_exports(docs):
    exported = exported_names()
    (rule,) = find(docs, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"DecodebenchQueueStuck", "DecodebenchWorkerCrashLooping", "DecodebenchRedisMemoryHigh"}
    for name, r in alerts.items():
        expr = r["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), name
        used = set(re.findall(r"\b([a-z_]+)\{", expr))
        assert used and used <= exported | OUTSIDE, (name, used - exported - OUTSIDE)
        assert 'namespace="ml"' in expr  # this release's namespace only
    assert "> 0.8" in alerts["DecodebenchRedisMemoryHigh"]["expr"]


def test_flags_off_render_nothing_and_a_monitor_without_its_metrics_fails():
    plain = render(None)
    assert not [d for d in plain if d["apiVersion"] == "monitoring.coreos.com/v1"]
    (container,) = workers(plain)["gpu"]["spec"]["template"]["spec"]["containers"]
    assert (
        "ports" not in container and find(plain, "NetworkPolicy", "db-decodebench-worker")[0]["spec"]["ingress"] == []
    )
    assert "set metrics.enabled too" in render_error({"metrics": {"podMonitor": {"enabled": True}}})
    assert "set redis.metrics.enabled too" in render_error({"metrics": {"serviceMonitor": {"enabled": True}}})


def test_the_grafana_dashboard_is_json_and_plots_exported_metrics(docs):
    (cm,) = find(docs, "ConfigMap", "db-decodebench-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["decodebench.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 8
    for expr in exprs:
        used = set(re.findall(r"\b([a-z_]+)\{", expr))
        assert used and used <= exported_names() | OUTSIDE, (expr, used)
        assert expr.count("(") == expr.count(")")
