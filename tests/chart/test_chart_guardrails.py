"""Guardrails the chart checks at render time, with the real helm (docs/deploy.md, "Guardrails"):
GitOps mode (no generated Secret, two renders byte-identical), the CRD kinds the cluster serves,
monitors whose scrape the release's own NetworkPolicies would drop, KEDA's target per pod from the
pool's GPUs, and a pool switched from manual replicas to KEDA keeping its pods through Helm's merge.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from tests.support.chart import (
    CHART,
    CRD_ARGS,
    KUBE_VERSIONS,
    VALUES_BY_NAME,
    _values_args,
    find,
    helm,
    render,
    render_error,
    workers,
)

EXISTING = {
    "signingKey": {"existingSecret": "db-signing"},
    "server": {"tokens": {"existingSecret": "db-tokens"}},
    "redis": {"auth": {"existingSecret": "db-redis"}},
    "controller": {"tokenSecret": "db-controller-token"},
}
SCRAPERS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
EVERYTHING = {
    "gitops": True,
    **EXISTING,
    "worker": {"pools": [{"name": "h100", "gpus": 4, "queues": ["default"], "autoscaling": {"enabled": True}}]},
    "reportWorkers": {"enabled": True, "queues": ["default"], "autoscaling": {"enabled": True}},
    "metrics": {
        "enabled": True,
        "allowedFrom": SCRAPERS,
        "podMonitor": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "serverMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
    },
    "redis": {"auth": {"existingSecret": "db-redis"}, "metrics": {"enabled": True}},
    "server": {
        "tokens": {"existingSecret": "db-tokens"},
        "ingress": {"enabled": True, "host": "decodebench.example.com", "tls": {"certManager": {"issuer": "le"}}},
    },
}


def template_text(*values, chart: Path = CHART) -> str:
    proc = helm("template", "db", "{chart}", "--namespace", "ml", "--kube-version", KUBE_VERSIONS[-1], *CRD_ARGS,
                *_values_args(list(values)), chart=chart)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# --- GitOps mode ---------------------------------------------------------------------------------


def test_gitops_mode_refuses_in_one_line_every_secret_it_would_generate():
    err = render_error({"gitops": True})
    (line,) = [x for x in err.splitlines() if "gitops" in x]
    for value in ("signingKey.existingSecret", "server.tokens.existingSecret", "redis.auth.existingSecret",
                  "controller.tokenSecret"):  # fmt: skip
        assert value in line
    # one missing, one named
    partial = copy.deepcopy(EXISTING) | {"gitops": True}
    del partial["signingKey"]
    err = render_error(partial)
    assert "set signingKey.existingSecret" in err and "server.tokens" not in err


@pytest.mark.parametrize("values", [{"gitops": True, **EXISTING}, EVERYTHING], ids=["minimal", "everything"])
def test_gitops_mode_renders_byte_identical_twice_and_generates_no_secret(values):
    first, second = template_text(values), template_text(values)
    assert first == second
    docs = render(values)
    assert not find(docs, "Secret")  # every Secret is the operator's
    names = {v["secret"]["secretName"] for _, spec in _specs(docs) for v in spec.get("volumes", []) if "secret" in v}
    assert {"db-signing", "db-tokens", "db-redis", "db-controller-token"} <= names


def test_without_gitops_two_renders_differ_the_caveat_gitops_mode_removes():
    assert template_text({}) != template_text({})  # generated signing key, token and Redis password


def _specs(docs):
    for d in docs:
        if d["kind"] == "Pod":
            yield d["metadata"]["name"], d["spec"]
        elif d["kind"] in ("Deployment", "StatefulSet"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


# --- the kinds the cluster serves ------------------------------------------------------------------


def test_keda_and_monitoring_kinds_must_be_served_by_the_cluster():
    err = render_error(VALUES_BY_NAME["keda"], api_versions=False)
    assert "keda.sh/v1alpha1/ScaledObject is not served by this cluster: install KEDA" in err
    err = render_error({"metrics": {"prometheusRule": {"enabled": True}}}, api_versions=False)
    assert "monitoring.coreos.com/v1/PrometheusRule is not served by this cluster" in err
    assert find(render(VALUES_BY_NAME["keda"]), "ScaledObject")  # served: renders
    # off (helm lint's case): renders without them
    proc = helm("template", "db", "{chart}", *_values_args([VALUES_BY_NAME["keda"], {"capabilityCheck": False}]))
    assert proc.returncode == 0, proc.stderr


# --- monitors and NetworkPolicies ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"metrics": {"enabled": True, "podMonitor": {"enabled": True}}},
            "metrics.podMonitor: the workers' NetworkPolicy admits no scraper",
        ),
        (
            {"metrics": {"serverMonitor": {"enabled": True}}},
            "metrics.serverMonitor: the server's NetworkPolicy admits no scraper",
        ),
        (
            {"redis": {"metrics": {"enabled": True}}, "metrics": {"serviceMonitor": {"enabled": True}}},
            "metrics.serviceMonitor: Redis's NetworkPolicy admits no scraper",
        ),
    ],
    ids=["podMonitor", "serverMonitor", "serviceMonitor"],
)
def test_a_monitor_the_network_policies_would_block_fails_to_render(values, message):
    assert message in render_error(values)
    # without NetworkPolicies nothing blocks the scrape
    render(values | {"networkPolicy": {"enabled": False}})


def test_the_policies_admit_the_scraper_by_metrics_allowed_from_on_each_scraped_port():
    docs = render(EVERYTHING)
    ports = {}
    for policy in find(docs, "NetworkPolicy"):
        for rule in policy["spec"].get("ingress") or []:
            if rule.get("from") == SCRAPERS:
                ports[policy["metadata"]["name"]] = [p["port"] for p in rule["ports"]]
    assert ports == {"db-decodebench-worker": [9400], "db-decodebench-server": [9090], "db-decodebench-redis": [9121]}
    (server,) = [d for d in find(docs, "Deployment") if d["metadata"]["name"] == "db-decodebench-server"]
    (container,) = server["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9090} in container["ports"]
    (monitor,) = find(docs, "ServiceMonitor", "db-decodebench-server")
    (svc,) = find(docs, "Service", "db-decodebench-server")
    assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


# --- KEDA's target per pod -------------------------------------------------------------------------


def targets(pools: list[dict]) -> dict[str, str]:
    docs = render({"worker": {"pools": pools}})
    return {d["metadata"]["labels"]["decodebench.io/pool"]: d["spec"]["advanced"]["scalingModifiers"]["target"]
            for d in find(docs, "ScaledObject")}  # fmt: skip


def test_jobs_per_replica_defaults_to_the_pools_worker_processes():
    on = {"enabled": True}
    got = targets([
        {"name": "one", "gpus": 1, "queues": ["a"], "autoscaling": on},
        {"name": "eight", "gpus": 8, "queues": ["a"], "autoscaling": on},
        {"name": "cpu", "gpus": 0, "queues": ["a"], "autoscaling": on},
        {"name": "set", "gpus": 1, "queues": ["a"], "autoscaling": {"enabled": True, "jobsPerReplica": 3}},
    ])  # fmt: skip
    # a one-GPU pool aims at one job per pod, not four (4x fewer pods than waiting jobs)
    assert got == {"one": "1", "eight": "8", "cpu": "1", "set": "3"}


# --- manual replicas -> KEDA, through Helm's three-way merge ----------------------------------------


def three_way(original: dict, modified: dict, live: dict) -> dict:
    """What `helm upgrade` leaves: Helm patches the live object with the change from the release's
    previous manifest (original) to the new one (modified): a field the new manifest drops is
    deleted, a field it sets is set, a field neither names stays as the cluster has it."""
    out = copy.deepcopy(live)
    for key in original.keys() - modified.keys():
        out.pop(key, None)
    for key, value in modified.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and isinstance(original.get(key), dict):
            out[key] = three_way(original[key], value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


def chart_with_cluster(tmp_path: Path) -> Path:
    """The chart with its one lookup (the live Deployment) answered from values: the stand-in for a
    cluster that `helm template` cannot reach."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    guardrails = chart / "templates" / "_guardrails.tpl"
    text = guardrails.read_text()
    lookup = 'lookup "apps/v1" "Deployment" .root.Release.Namespace .name'
    assert lookup in text
    guardrails.write_text(text.replace(lookup, "get (.root.Values.live | default dict) .name"))
    (chart / "values.schema.json").unlink()
    return chart


def deployment(docs: list[dict], name: str) -> dict:
    (dep,) = find(docs, "Deployment", name)
    return dep


def test_a_pool_switched_to_keda_keeps_its_busy_pods_through_helms_merge(tmp_path):
    chart = chart_with_cluster(tmp_path)
    name = "db-decodebench-worker-gpu"
    manual = {"worker": {"pools": [{"name": "gpu", "replicas": 3, "queues": ["default"]}]}}
    keda = {
        "worker": {"pools": [{"name": "gpu", "replicas": 3, "queues": ["default"], "autoscaling": {"enabled": True}}]}
    }
    original = deployment(render(manual, chart=chart), name)
    live = copy.deepcopy(original)  # the cluster: 3 busy pods
    assert live["spec"]["replicas"] == 3

    # the switch, as `helm upgrade` renders it (lookup finds the live Deployment)
    modified = deployment(render(keda, {"live": {name: live}}, chart=chart), name)
    after = three_way(original, modified, live)
    assert after["spec"]["replicas"] == 3  # not dropped: Kubernetes would have reset it to 1

    # what the old chart did: no replicas in the new manifest, so the merge deletes the field
    bare = copy.deepcopy(modified)
    del bare["spec"]["replicas"]
    assert "replicas" not in three_way(original, bare, live)["spec"]  # -> defaulted to 1 by the API server

    # later upgrades under KEDA follow KEDA's count (here 5), never reset it
    live["spec"]["replicas"] = 5
    again = deployment(render(keda, {"live": {name: live}}, chart=chart), name)
    assert three_way(modified, again, live)["spec"]["replicas"] == 5

    # a first install (nothing to look up) leaves the count to KEDA
    assert "replicas" not in deployment(render(keda, chart=chart), name)["spec"]
    # GitOps mode looks nothing up: the render stays the same whatever the cluster holds
    gitops = {"gitops": True, **EXISTING, "live": {name: live}}
    assert "replicas" not in deployment(render(keda, gitops, chart=chart), name)["spec"]


def test_the_report_workers_switch_keeps_their_pods_the_same_way(tmp_path):
    chart = chart_with_cluster(tmp_path)
    name = "db-decodebench-report-worker"
    values = {"reportWorkers": {"enabled": True, "queues": ["default"], "autoscaling": {"enabled": True}}}
    live = {"spec": {"replicas": 2}}
    assert deployment(render(values, {"live": {name: live}}, chart=chart), name)["spec"]["replicas"] == 2


def test_the_worker_pools_of_the_shipped_values_are_unchanged_without_autoscaling():
    for name in ("gpu-two-pools", "cpu-only"):
        for dep in workers(render(VALUES_BY_NAME[name])).values():
            assert isinstance(dep["spec"]["replicas"], int)


# --- smaller defaults ------------------------------------------------------------------------------


def test_dns_egress_goes_to_the_clusters_dns_pods_not_anywhere():
    kube_dns = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    for values, peers in (({}, [kube_dns]), ({"networkPolicy": {"egress": {"dnsTo": []}}}, None)):
        for policy in find(render(values), "NetworkPolicy"):
            for rule in policy["spec"].get("egress") or []:
                if {"protocol": "UDP", "port": 53} in rule["ports"]:
                    assert rule.get("to") == peers, policy["metadata"]["name"]


def test_redis_has_a_disruption_budget_that_makes_a_drain_wait():
    (pdb,) = find(render({}), "PodDisruptionBudget", "db-decodebench-redis")
    assert pdb["spec"]["maxUnavailable"] == 0
    (sts,) = find(render({}), "StatefulSet")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert not find(
        render({"redis": {"podDisruptionBudget": {"enabled": False}}}), "PodDisruptionBudget", "db-decodebench-redis"
    )


def test_extra_objects_are_released_with_the_chart():
    sealed = {"apiVersion": "bitnami.com/v1alpha1", "kind": "SealedSecret", "metadata": {"name": "db-tokens"}}
    text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: '{{ .Release.Name }}-extra'}\n"
    docs = render({"extraObjects": [sealed, text]})
    assert find(docs, "SealedSecret", "db-tokens") and find(docs, "ConfigMap", "db-extra")


def test_an_extra_env_may_not_name_a_variable_the_chart_sets_in_its_container():
    """Two env entries of one name (a pool's extraEnv overriding the chart's DECODEBENCH_STOP_GRACE, HF_HOME,
    ...) rendered without a word: server-side apply (Helm 4, Argo CD, Flux) refuses the Deployment, a
    client-side apply silently keeps the last one. A variable the chart leaves alone stays the pool's to set."""
    own = {"worker": {"pools": [{"name": "gpu"}, {"name": "cpu", "gpus": 0, "extraEnv": [{"name": "HF_HOME"}]}]}}
    message = render_error(own)
    assert "worker.pools[cpu].extraEnv: HF_HOME is set by the chart in this container" in message, message
    stop = {"worker": {"poolDefaults": {"extraEnv": [{"name": "DECODEBENCH_STOP_GRACE", "value": "60"}]}}}
    assert "worker.pools[gpu].extraEnv: DECODEBENCH_STOP_GRACE is set by the chart" in render_error(stop)
    ttl = {"worker": {"poolDefaults": {"extraEnv": [{"name": "DECODEBENCH_HEARTBEAT_TTL", "value": "20"}]}}}
    env = workers(render(ttl))["gpu"]["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("DECODEBENCH_HEARTBEAT_TTL") == 1 and len(names) == len(set(names))
    report = {"reportWorkers": {"enabled": True, "extraEnv": [{"name": "DECODEBENCH_STOP_GRACE", "value": "5"}]}}
    assert "reportWorkers.extraEnv: DECODEBENCH_STOP_GRACE is set by the chart" in render_error(report)
    server = {"server": {"extraEnv": [{"name": "DECODEBENCH_TOKENS_FILE", "value": "/x"}]}}
    assert "server.extraEnv: DECODEBENCH_TOKENS_FILE is set by the chart" in render_error(server)
    controller = {"controller": {"extraEnv": [{"name": "DECODEBENCH_API_URL", "value": "http://x"}]}}
    assert "controller.extraEnv: DECODEBENCH_API_URL is set by the chart" in render_error(controller)
