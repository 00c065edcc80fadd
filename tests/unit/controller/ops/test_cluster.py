"""`decodebench cluster status|scale` against a Kubernetes API stand-in: a real HTTP server on
loopback serving the API paths the commands use, with the Deployments the chart renders (and
pods made from their templates), and a real redis-server holding RQ queues and workers.
"""

from __future__ import annotations

import json
import re
import threading

import pytest
import yaml
from click.testing import CliRunner
from redis import Redis
from rq import Queue, Worker
from rq.serializers import JSONSerializer

from controller.cli import main
from tests.support.chart import VALUES_BY_NAME, find, render
from tests.support.kube import NS, KubeStandIn, make_pod
from tests.support.services import free_port
from worker.core import keys


@pytest.fixture()
def kube(tmp_path, monkeypatch):
    """The stand-in, and a kubeconfig whose current context points at it (namespace ml)."""
    stand_in = KubeStandIn()
    thread = threading.Thread(target=stand_in.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": stand_in.url}}],
        "users": [{"name": "tester", "user": {"token": "t0ken"}}],
        "contexts": [
            {"name": "lab", "context": {"cluster": "lab", "user": "tester", "namespace": NS}},
            {"name": "other", "context": {"cluster": "lab", "user": "tester", "namespace": "other"}},
        ],
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield stand_in
    stand_in.server.shutdown()
    stand_in.server.server_close()


def cli(*args: str):
    return CliRunner().invoke(main, ["cluster", *args])


TWO_POOLS = {
    "h100": [{}, {}],
    "a10g": [{}, {"ready": False, "waiting": "CrashLoopBackOff", "restarts": 4}, {"ready": False, "node": None}],
}


def fill_redis(url: str, kube: KubeStandIn) -> None:
    """Queued jobs for three tenants, and RQ workers registered from the h100 pods (3 of 16 busy)."""
    conn = Redis.from_url(url)
    for queue, n in (
        ("decodebench.nlp-research.high", 3),
        ("decodebench.safety.normal", 2),
        ("decodebench.other-team.low", 5),
    ):
        q = Queue(queue, connection=conn, serializer=JSONSerializer)
        for i in range(n):
            q.enqueue(keys.RQ_FUNCTION, {"job": i})
    h100_pods = [p["metadata"]["name"] for p in kube.pods if p["metadata"]["labels"]["decodebench.io/pool"] == "h100"]
    for i in range(16):
        w = Worker([Queue("decodebench.nlp-research.high", connection=conn)], connection=conn, name=f"w{i}")
        w.hostname = h100_pods[i // 8]
        w.register_birth()
        w.set_state("busy" if i in (0, 1, 9) else "idle")


def test_cluster_group_is_registered():
    assert "cluster" in main.commands and {"status", "scale"} <= main.commands["cluster"].commands.keys()


def test_status_shows_pods_gpus_queue_depth_and_workers_per_pool(kube, redis_url):
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"], pods=TWO_POOLS)
    fill_redis(redis_url, kube)
    result = cli("status", "--redis-url", redis_url, "--output", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["namespace"] == NS and doc["queue_depth_unavailable"] is None
    pools = {p["name"]: p for p in doc["pools"]}
    h100, a10g = pools["h100"], pools["a10g"]
    assert (h100["replicas"], h100["ready"], h100["gpus_per_pod"]) == (2, 2, 8)
    assert [p["gpus"] for p in h100["pods"]] == [8, 8] and all(p["ready"] for p in h100["pods"])
    assert h100["queued"] == 5  # nlp-research + safety
    assert (h100["idle"], h100["busy"]) == (13, 3)
    assert a10g["queued"] == 10  # "*": every decodebench queue
    assert (a10g["replicas"], a10g["ready"], a10g["idle"], a10g["busy"]) == (4, 1, 0, 0)
    assert sorted(p["phase"] for p in a10g["pods"]) == ["CrashLoopBackOff", "Running", "Unschedulable"]
    assert max(p["restarts"] for p in a10g["pods"]) == 4
    assert kube.requests[0]["auth"] == "Bearer t0ken"
    selectors = {r["query"]["labelSelector"][0] for r in kube.requests}
    assert selectors == {"app.kubernetes.io/name=decodebench,app.kubernetes.io/component in (worker,report-worker)"}


def test_report_workers_are_a_pool_of_their_own_and_count_only_report_cells(kube, redis_url):
    """The report-worker Deployment (reportWorkers) is the pool `report-workers`: its queued jobs are the
    report cells, a GPU pool's are not, and `cluster scale` patches it (the Role names it)."""
    values = {"reportWorkers": {"enabled": True}}
    kube.add_release(values, pods={"gpu": [{}]})
    (report,) = find(render(values, namespace=NS), "Deployment", "db-decodebench-report-worker")
    report["metadata"]["namespace"] = NS
    report["status"] = {"replicas": 1, "readyReplicas": 1}
    kube.deployments[report["metadata"]["name"]] = report
    kube.pods.append(make_pod(report, "db-decodebench-report-worker-5f6d7c8b9-00000"))
    conn = Redis.from_url(redis_url)
    for queue, n in ((keys.report_queue("default"), 7), (keys.queue_name("default"), 2)):
        q = Queue(queue, connection=conn, serializer=JSONSerializer)
        for i in range(n):
            q.enqueue(keys.RQ_FUNCTION, {"job": i})
    result = cli("status", "--redis-url", redis_url, "--output", "json")
    assert result.exit_code == 0, result.output
    pools = {p["name"]: p for p in json.loads(result.output)["pools"]}
    assert set(pools) == {"gpu", "report-workers"}
    assert pools["gpu"]["queued"] == 2 and len(pools["gpu"]["pods"]) == 1
    assert pools["report-workers"]["queued"] == 7 and len(pools["report-workers"]["pods"]) == 1
    result = cli("scale", "report-workers", "--replicas", "3")
    assert result.exit_code == 0, result.output
    (patch,) = [r for r in kube.requests if r["method"] == "PATCH"]
    assert patch["path"].endswith("/deployments/db-decodebench-report-worker/scale")
    assert kube.deployments["db-decodebench-report-worker"]["spec"]["replicas"] == 3
    assert "resets it to reportWorkers.replicas" in result.output  # not a GPU pool's values
    helps = [re.sub(r"-\s+", "-", cli(*args, "--help").output) for args in ((), ("scale",), ("status",))]
    assert all("report-workers" in text or "report workers" in text for text in helps)  # --help names the pool
    (role,) = find(render(values, namespace=NS), "Role", "db-decodebench-controller")
    (rule,) = [r for r in role["rules"] if r["resources"] == ["deployments/scale"]]
    assert "db-decodebench-report-worker" in rule["resourceNames"]
    autoscaled = {"reportWorkers": {"enabled": True, "queues": ["default"], "autoscaling": {"enabled": True}}}
    (role,) = find(render(autoscaled, namespace=NS), "Role", "db-decodebench-controller")
    assert all("db-decodebench-report-worker" not in r.get("resourceNames", []) for r in role["rules"])


def test_status_table(kube, redis_url):
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"], pods=TWO_POOLS)
    fill_redis(redis_url, kube)
    result = cli("status", "--redis-url", redis_url)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "namespace ml"
    assert lines[1].split() == ["POOL", "RELEASE", "READY", "GPUS/POD", "QUEUED", "IDLE", "BUSY", "SCALING"]
    assert ["h100", "db", "2/2", "8", "5", "13", "3", "manual"] in [line.split() for line in lines]
    assert any("CrashLoopBackOff" in line and "a10g" in line for line in lines)


def test_status_names_the_tenants_file_each_pod_runs_and_says_when_they_differ(kube, redis_url):
    """A ConfigMap change reaches the pods one by one: the second h100 pod's last two workers still run the old
    file (the digest each worker writes into its RQ hash, worker.rq.reload)."""
    import hashlib

    kube.add_release(VALUES_BY_NAME["gpu-two-pools"], pods=TWO_POOLS)
    fill_redis(redis_url, kube)
    conn = Redis.from_url(redis_url)
    new, old = (hashlib.sha256(text).hexdigest() for text in (b"tenants: [new]", b"tenants: [old]"))
    for i in range(16):
        conn.hset(Worker.redis_worker_namespace_prefix + f"w{i}", keys.WORKER_TENANTS_FIELD, old if i >= 14 else new)
    doc = json.loads(cli("status", "--redis-url", redis_url, "--output", "json").output)
    h100 = next(p for p in doc["pools"] if p["name"] == "h100")
    assert h100["tenants_files"] == {new: 14, old: 2}
    assert [p["tenants_files"] for p in h100["pods"]] == [[new], [new, old]]
    result = cli("status", "--redis-url", redis_url)
    rows = [line.split() for line in result.output.splitlines()]
    pods = [row for row in rows if row and "decodebench-worker-h100-" in row[0]]
    assert [row[7:] for row in pods] == [[new[:12]], ["2", "files"]]
    assert f"the workers run under 2 tenants files ({new[:12]} on 14 workers, {old[:12]} on 2 workers)" in result.output
    for i in range(14, 16):  # the change has reached every pod: nothing to say
        conn.hset(Worker.redis_worker_namespace_prefix + f"w{i}", keys.WORKER_TENANTS_FIELD, new)
    assert "tenants files" not in cli("status", "--redis-url", redis_url).output


def test_status_without_redis_still_lists_the_pods(kube):
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"], pods=TWO_POOLS)
    result = cli("status", "--redis-url", f"redis://:secret@127.0.0.1:{free_port()}/0")
    assert result.exit_code == 0, result.output
    assert "queue depth unavailable: cannot read RQ queues at redis://***@127.0.0.1" in result.output
    assert "secret" not in result.output
    assert ["h100", "db", "2/2", "8", "-", "-", "-", "manual"] in [line.split() for line in result.output.splitlines()]
    assert result.output.count("decodebench-worker-h100-") == 2


def test_status_follows_release_namespace_and_context(kube):
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"], release="db", pods=TWO_POOLS)
    kube.add_release(VALUES_BY_NAME["cpu-only"], release="dev", pods={"cpu": [{}]})
    result = cli("status", "--release", "dev", "-o", "json", "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert [p["name"] for p in json.loads(result.output)["pools"]] == ["cpu"]
    assert kube.requests[-1]["query"]["labelSelector"][0].endswith(",app.kubernetes.io/instance=dev")
    seen = len(kube.requests)
    result = cli("status", "--context", "other")
    assert result.exit_code == 0 and "namespace other" in result.output
    assert "no decodebench worker pools" in result.output
    assert all("/namespaces/other/" in r["path"] for r in kube.requests[seen:])
    result = cli("status", "-n", "elsewhere")
    assert "namespace elsewhere" in result.output


def test_scale_patches_the_pool_deployment(kube):
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"], pods=TWO_POOLS)
    result = cli("scale", "a10g", "--replicas", "6")
    assert result.exit_code == 0, result.output
    assert "pool a10g: 4 -> 6 replicas" in result.output
    (patch,) = [r for r in kube.requests if r["method"] == "PATCH"]
    assert patch["path"] == "/apis/apps/v1/namespaces/ml/deployments/db-decodebench-worker-a10g/scale"
    assert patch["body"] == {"spec": {"replicas": 6}}
    assert "patch" in patch["content_type"]
    assert kube.deployments["db-decodebench-worker-a10g"]["spec"]["replicas"] == 6
    assert cli("scale", "a10g", "--replicas", "0").exit_code == 0  # an idle pool can give its GPUs back


def test_scale_unknown_pool_names_the_pools(kube):
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"])
    result = cli("scale", "v100", "--replicas", "1")
    assert result.exit_code == 2
    assert result.output.strip() == "error: no worker pool 'v100' in namespace ml (pools: a10g, h100)"


def test_scale_needs_a_release_when_two_have_the_pool(kube):
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"], release="db")
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"], release="db2")
    result = cli("scale", "h100", "--replicas", "1")
    assert result.exit_code == 2 and "choose one with --release" in result.output
    assert cli("scale", "h100", "--replicas", "1", "--release", "db2").exit_code == 0
    assert kube.deployments["db2-decodebench-worker-h100"]["spec"]["replicas"] == 1
    assert kube.deployments["db-decodebench-worker-h100"]["spec"]["replicas"] == 2


def test_scale_refuses_an_autoscaled_pool(kube):
    kube.add_release(VALUES_BY_NAME["keda"])
    result = cli("scale", "h100", "--replicas", "3")
    assert result.exit_code == 2 and "autoscaled by KEDA" in result.output
    assert not [r for r in kube.requests if r["method"] == "PATCH"]


def test_scale_rejects_negative_replicas(kube):
    result = cli("scale", "h100", "--replicas", "-1")
    assert result.exit_code == 2 and "-1 is not in the range x>=0" in result.output
    assert not kube.requests


def test_rbac_forbidden_is_one_clear_line(kube):
    kube.add_release(VALUES_BY_NAME["gpu-two-pools"])
    kube.forbidden.add(("PATCH", "deployments/scale"))
    result = cli("scale", "h100", "--replicas", "1")
    assert result.exit_code == 1
    assert result.output.startswith(
        "error: Kubernetes API refused to scale deployment db-decodebench-worker-h100 "
        "in namespace ml: deployments/scale is forbidden"
    )
    assert "controller.rbac.create" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    kube.forbidden.add(("GET", "pods"))
    result = cli("status")
    assert result.exit_code == 1 and "refused to list pods" in result.output


def test_no_cluster_access_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = cli("status")
    assert result.exit_code == 2 and result.output.startswith("error: no Kubernetes access")
    assert "KUBECONFIG" in result.output


def test_unknown_context_is_a_usage_error(kube):
    result = cli("status", "--context", "prod")
    assert result.exit_code == 2 and "no Kubernetes access" in result.output and "prod" in result.output


def test_unreachable_api_server_is_a_service_error(kube, tmp_path, monkeypatch):
    config = yaml.safe_load((tmp_path / "kubeconfig").read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    result = cli("status")
    assert result.exit_code == 1 and "cannot reach the Kubernetes API at http://127.0.0.1:" in result.output
