"""The values platform teams expect (tests/chart/values/platform-knobs.yaml): a registry mirror
and pull secrets for every image, ServiceAccounts of their own, common labels on every object,
S3 and Hub egress narrowed to CIDRs or an egress proxy, and the GPU `helm test` opt-in.
"""

from __future__ import annotations

from tests.support.chart import VALUES_BY_NAME, env_of, find, pod_specs, render, render_error

KNOBS = VALUES_BY_NAME["platform-knobs"]
TENANTS = VALUES_BY_NAME["tenants"]  # Redis with its ACL init container and exporter


def images(docs):
    for name, spec in pod_specs(docs):
        for c in spec.get("initContainers", []) + spec["containers"]:
            yield f"{name}/{c['name']}", c["image"]


def test_a_registry_mirror_serves_every_image_paths_kept():
    docs = render(KNOBS, {"redis": {"metrics": {"enabled": True}}})
    found = dict(images(docs))
    assert all(image.startswith("registry.internal.example:5000/") for image in found.values()), found
    assert found["db-decodebench-redis/redis"].startswith(
        "registry.internal.example:5000/library/redis:7.4.6-alpine@sha256:"
    )
    assert (
        found["db-decodebench-worker-h100/worker"]
        == "registry.internal.example:5000/decodebench/decodebench-worker:0.1.0"
    )
    bare = render({"global": {"imageRegistry": "mirror.example"}, "worker": {"image": {"repository": "team/worker"}}})
    assert (
        dict(images(bare))["db-decodebench-worker-gpu/worker"] == "mirror.example/team/worker:0.1.0"
    )  # no host: prefixed
    assert all(not image.startswith("registry") for _, image in images(render(TENANTS)))  # unset: unchanged


def test_pull_secrets_of_both_levels_reach_every_pod_once():
    for name, spec in pod_specs(render(KNOBS, {"imagePullSecrets": [{"name": "ghcr-pull"}, {"name": "mirror-pull"}]})):
        assert spec["imagePullSecrets"] == [{"name": "mirror-pull"}, {"name": "ghcr-pull"}], name
    for name, spec in pod_specs(render(None)):
        assert "imagePullSecrets" not in spec, name


def test_service_accounts_of_your_own():
    docs = render(KNOBS)
    assert not find(docs, "ServiceAccount")
    accounts = {name: spec["serviceAccountName"] for name, spec in pod_specs(docs) if "redis" not in name}
    assert accounts.pop("db-decodebench-controller") == "ml-decodebench-controller"
    assert set(accounts.values()) == {"ml-decodebench-worker"}  # the pools and the helm test pods
    (binding,) = find(docs, "RoleBinding")
    assert binding["subjects"][0]["name"] == "ml-decodebench-controller"  # the Role goes to your account
    named = render({"controller": {"serviceAccount": {"name": "ctl"}}})
    assert [sa["metadata"]["name"] for sa in find(named, "ServiceAccount")] == ["ctl", "db-decodebench-worker"]
    default = render({"worker": {"serviceAccount": {"create": False}}})
    workers = {
        spec["serviceAccountName"] for n, spec in pod_specs(default) if "controller" not in n and "redis" not in n
    }
    assert workers == {"default"}


def test_common_labels_on_every_object_and_pod_but_never_over_the_charts_own():
    docs = render(KNOBS, {"commonLabels": {"team": "ml-platform", "app.kubernetes.io/name": "hijack"}})
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["team"] == "ml-platform" and labels["app.kubernetes.io/name"] == "decodebench", doc["kind"]
    for d in find(docs, "Deployment"):
        assert d["spec"]["template"]["metadata"]["labels"]["cost-center"] == "4711"


def egress(docs, component: str) -> list[dict]:
    (policy,) = find(docs, "NetworkPolicy", f"db-decodebench-{component}")
    return policy["spec"]["egress"]


def test_s3_and_hub_egress_narrow_to_cidrs():
    narrow = {
        "networkPolicy": {
            "egress": {
                "s3To": [{"ipBlock": {"cidr": "52.218.0.0/17"}}],
                "huggingFaceTo": [{"ipBlock": {"cidr": "10.20.0.0/24"}}],
            }
        }
    }
    rules = egress(render(narrow), "worker")
    https = [r for r in rules if {"protocol": "TCP", "port": 443} in r.get("ports", [])]
    assert [r["to"] for r in https] == [
        [{"ipBlock": {"cidr": "52.218.0.0/17"}}],
        [{"ipBlock": {"cidr": "10.20.0.0/24"}}],
    ]
    assert all("to" in r for r in rules if r["ports"][0]["port"] not in (53,))  # no port open to anywhere


def test_an_egress_proxy_takes_s3_and_the_hub():
    docs = render(KNOBS)
    for component in ("worker", "controller"):
        rules = egress(docs, component)
        assert not [r for r in rules if r["ports"][0]["port"] == 443 and component == "worker"]
        (proxy,) = [r for r in rules if r["ports"] == [{"protocol": "TCP", "port": 3128}]]
        assert proxy["to"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "infra"}}
    for name, spec in pod_specs(docs):
        if "redis" in name:
            continue
        env = env_of(spec["containers"][0])
        assert env["HTTPS_PROXY"]["value"] == "http://egress-proxy.infra.svc:3128", name
        assert env["NO_PROXY"]["value"] == ".svc,.cluster.local,localhost,127.0.0.1,.internal.example"
    # an in-cluster store (MinIO) stays direct: its rule is kept and its host bypasses the proxy
    minio = render(KNOBS, {"store": {"endpointUrl": "http://minio.storage:9000"}})
    assert any(r["ports"] == [{"protocol": "TCP", "port": 9000}] for r in egress(minio, "worker"))
    (_, spec), *_ = [(n, s) for n, s in pod_specs(minio) if "worker" in n]
    assert "minio.storage" in env_of(spec["containers"][0])["NO_PROXY"]["value"].split(",")
    message = render_error({"networkPolicy": {"egress": {"proxy": {"url": "http://proxy:3128"}}}})
    assert "networkPolicy.egress.proxy: set `to`" in message


def test_the_gpu_helm_test_is_opt_in_and_queued_like_its_pool():
    assert not find(render(None), "Pod", "db-decodebench-gpu-doctor")
    (pod,) = find(render(KNOBS), "Pod", "db-decodebench-gpu-doctor")
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research-gpus"
    assert pod["metadata"]["labels"]["decodebench.io/pool"] == "h100"
