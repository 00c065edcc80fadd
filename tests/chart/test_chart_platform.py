"""What a platform team relies on beyond "it renders": disruption safety for long drains, MIG and
whole-GPU pinning, the open pass-through keys, Redis hardening (checked on a real redis-server),
NetworkPolicy egress, provenance from the downward API, the GPU doctor of `helm test`, and NOTES.
"""

from __future__ import annotations

import socket
import subprocess
import time

import kubernetes_validate
import pytest
import redis

from tests.support.chart import VALUES_BY_NAME, env_of, find, render, render_error, render_notes, workers

MIG = VALUES_BY_NAME["mig-kueue"]


def pod_template(docs, pool):
    return workers(docs)[pool]["spec"]["template"]


# --- long drains ------------------------------------------------------------------------------


def test_worker_pods_keep_node_autoscalers_from_evicting_them_mid_job():
    docs = render(VALUES_BY_NAME["gpu-two-pools"])
    for pool in ("h100", "a10g"):
        annotations = pod_template(docs, pool)["metadata"]["annotations"]
        assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
        assert annotations["karpenter.sh/do-not-disrupt"] == "true"
    mig = pod_template(render(MIG), "a100-mig")["metadata"]
    assert "karpenter.sh/do-not-disrupt" not in mig["annotations"]  # null drops a default
    assert mig["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"  # the rest merge
    assert mig["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-batch"


def test_each_pool_has_a_disruption_budget_selecting_its_pods():
    docs = render(MIG)
    budgets = {d["metadata"]["name"]: d for d in find(docs, "PodDisruptionBudget")}
    for deployment in workers(docs).values():
        pdb = budgets[deployment["metadata"]["name"]]
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert selector == deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert budgets["db-decodebench-worker-a100-mig"]["spec"]["maxUnavailable"] == 0
    assert budgets["db-decodebench-worker-cpu"]["spec"]["maxUnavailable"] == 1


def test_rollout_wall_time_is_stated_on_each_pool():
    pools = workers(render(VALUES_BY_NAME["gpu-two-pools"]))
    h100 = pools["h100"]
    assert h100["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    grace = h100["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == 7200 + 120
    # 2 pods, one at a time, each draining for up to its grace period.
    assert h100["metadata"]["annotations"]["decodebench.io/rollout-max-seconds"] == str(2 * grace)
    mig = workers(render(MIG))["a100-mig"]
    assert mig["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 2
    assert mig["metadata"]["annotations"]["decodebench.io/rollout-max-seconds"] == str(3600 + 120)


# --- devices ----------------------------------------------------------------------------------


def test_mig_pools_pin_slices_and_cpu_pools_see_no_gpu():
    docs = render(MIG)
    mig = pod_template(docs, "a100-mig")["spec"]
    c = mig["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == 2
    assert env_of(c)["DECODEBENCH_WORKER_DEVICE"]["value"] == "mig"
    assert env_of(c)["DECODEBENCH_WORKER_PROCESSES"]["value"] == "2"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in mig["tolerations"]
    cpu = pod_template(docs, "cpu")["spec"]
    env = env_of(cpu["containers"][0])
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void" and "CUDA_DEVICE_ORDER" not in env
    assert env["DECODEBENCH_WORKER_DEVICE"]["value"] == "cpu"
    assert "tolerations" not in cpu  # the defaults' GPU toleration is dropped for a CPU pool
    assert not any(k.startswith("nvidia.com/") for k in cpu["containers"][0]["resources"].get("limits", {}))


# --- open pass-through keys, closed chart keys -----------------------------------------------


def test_kubernetes_keys_pass_through_to_the_pods():
    docs = render(MIG)
    spec = pod_template(docs, "a100-mig")["spec"]
    assert (spec["runtimeClassName"], spec["schedulerName"], spec["priorityClassName"]) == (
        "nvidia",
        "bin-packing-scheduler",
        "batch-gpu",
    )
    assert spec["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    c = spec["containers"][0]
    assert c["envFrom"] == [{"secretRef": {"name": "wandb-api-key"}}]
    assert {"name": "datasets", "mountPath": "/datasets", "readOnly": True} in c["volumeMounts"]
    assert {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets-ro", "readOnly": True}} in spec[
        "volumes"
    ]
    (ctl,) = find(docs, "Deployment", "db-decodebench-controller")
    ctl_spec = ctl["spec"]["template"]["spec"]
    assert ctl_spec["affinity"]["nodeAffinity"] and ctl["spec"]["template"]["metadata"]["labels"]["team"] == "platform"
    assert ctl_spec["containers"][0]["envFrom"] == [{"configMapRef": {"name": "decodebench-extra"}}]
    (sts,) = find(docs, "StatefulSet")
    assert sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert sts["spec"]["template"]["spec"]["priorityClassName"] == "system-queue"


def test_a_malformed_pass_through_value_is_caught_by_the_kubernetes_schema():
    bad = {"worker": {"pools": [{"name": "gpu", "topologySpreadConstraints": [{"topologyKey": "zone"}]}]}}
    (deployment,) = workers(render(bad)).values()
    with pytest.raises(kubernetes_validate.ValidationError, match="maxSkew"):
        kubernetes_validate.validate(deployment, "1.32.0", strict=True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"worker": {"pools": [{"name": "gpu", "podLabel": {"a": "b"}}]}}, "Additional property podLabel"),
        ({"controller": {"afinity": {}}}, "controller: Additional property afinity is not allowed"),
        ({"redis": {"metrics": {"enable": True}}}, "redis.metrics: Additional property enable is not allowed"),
        ({"worker": {"poolDefaults": {"podDisruptionBudget": {"minAvailable": 1}}}}, "Additional property"),
    ],
)
def test_typos_in_the_charts_own_keys_still_fail(values, message):
    assert message in render_error(values)


# --- Redis ------------------------------------------------------------------------------------


def redis_conf(*values) -> str:
    (cm,) = find(render(*values), "ConfigMap", "db-decodebench-redis")
    return cm["data"]["redis.conf"]


def test_redis_refuses_writes_below_its_memory_limit_and_keeps_no_rdb():
    conf = redis_conf(None).splitlines()
    assert f"maxmemory {2 * 2**30 * 3 // 4}" in conf  # 75% of the 2Gi limit
    assert 'save ""' in conf and "appendonly yes" in conf and "maxmemory-policy noeviction" in conf
    assert f"maxmemory {1200 * 2**20}" in redis_conf(MIG).splitlines()
    too_big = {"redis": {"maxmemory": "4gb"}}
    assert "must stay below redis.resources.limits.memory" in render_error(too_big)
    no_limit = {"redis": {"resources": {"requests": {"memory": "1Gi"}, "limits": None}}}
    assert "set redis.resources.limits.memory" in render_error(no_limit)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_rendered_redis_conf_runs_on_a_real_redis_server(tmp_path):
    """The ConfigMap's redis.conf, with what the container appends, read by redis-server itself."""
    conf = redis_conf({"redis": {"extraConfig": "# an ACL file would go here\nmaxclients 500"}})
    port = free_port()
    conf = conf.replace("port 6379", f"port {port}").replace("dir /data", f"dir {tmp_path}")
    (tmp_path / "redis.conf").write_text(conf + 'requirepass "s3cret"\nbind 127.0.0.1\n')
    server = subprocess.Popen(["redis-server", str(tmp_path / "redis.conf")], stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, password="s3cret")
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        assert client.config_get("maxmemory")["maxmemory"] == str(2 * 2**30 * 3 // 4)
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert client.config_get("save")["save"] == "" and client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("maxclients")["maxclients"] == "500"  # extraConfig appended
        for command in ("FLUSHALL", "FLUSHDB", "KEYS *"):
            with pytest.raises(redis.ResponseError, match="unknown command"):
                client.execute_command(command)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_redis_password_from_an_existing_secret_and_an_optional_exporter():
    docs = render(VALUES_BY_NAME["no-networkpolicy"])
    (sts,) = find(docs, "StatefulSet")
    (password,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "password"]
    assert password["secret"]["secretName"] == "decodebench-redis"
    assert "db-decodebench-redis" not in {d["metadata"]["name"] for d in find(docs, "Secret")}
    assert [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]] == ["redis"]
    docs = render(MIG)
    (sts,) = find(docs, "StatefulSet")
    exporter = sts["spec"]["template"]["spec"]["containers"][1]
    assert exporter["name"] == "metrics" and exporter["ports"] == [{"name": "metrics", "containerPort": 9121}]
    (service,) = find(docs, "Service", "db-decodebench-redis")
    assert {"name": "metrics", "port": 9121, "targetPort": "metrics"} in service["spec"]["ports"]
    (policy,) = find(docs, "NetworkPolicy", "db-decodebench-redis")
    scrape = policy["spec"]["ingress"][1]
    assert scrape["ports"] == [{"protocol": "TCP", "port": 9121}]
    assert scrape["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


# --- NetworkPolicy egress -----------------------------------------------------------------------


def egress_ports(policy: dict) -> set[tuple[str, int]]:
    return {(p["protocol"], p["port"]) for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}


def test_workers_server_and_controller_get_only_the_egress_they_need():
    docs = render(VALUES_BY_NAME["keda"])  # MinIO at http://minio.minio.svc:9000
    (worker,) = find(docs, "NetworkPolicy", "db-decodebench-worker")
    (server,) = find(docs, "NetworkPolicy", "db-decodebench-server")
    (controller,) = find(docs, "NetworkPolicy", "db-decodebench-controller")
    for policy in (worker, controller):
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["ingress"] == []
    for policy in (worker, server):
        assert {("UDP", 53), ("TCP", 53), ("TCP", 6379), ("TCP", 9000)} <= egress_ports(policy)
    # The controller reaches the server, never Redis.
    assert {("UDP", 53), ("TCP", 53), ("TCP", 8080), ("TCP", 9000)} <= egress_ports(controller)
    assert ("TCP", 6379) not in egress_ports(controller)
    server_rule = next(r for r in controller["spec"]["egress"] if {"protocol": "TCP", "port": 8080} in r["ports"])
    assert server_rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server"
    assert ("TCP", 443) in egress_ports(worker)  # the Hugging Face Hub
    assert {("TCP", 443), ("TCP", 6443)} <= egress_ports(controller)  # the Kubernetes API
    # The server takes connections on 8080 from its namespace.
    assert server["spec"]["ingress"] == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": 8080}]}]
    (expr,) = worker["spec"]["podSelector"]["matchExpressions"]
    assert expr["values"] == ["worker", "test"]  # helm test pods too
    redis_rule = next(r for r in worker["spec"]["egress"] if {"protocol": "TCP", "port": 6379} in r["ports"])
    assert redis_rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    external = render(VALUES_BY_NAME["external-redis"])  # rediss://…:6380, AWS S3
    (worker,) = find(external, "NetworkPolicy", "db-decodebench-worker")
    assert {("TCP", 6380), ("TCP", 443)} <= egress_ports(worker) and ("TCP", 6379) not in egress_ports(worker)


# --- provenance, helm test, NOTES ---------------------------------------------------------------


def test_every_result_can_record_image_pod_and_node():
    docs = render(VALUES_BY_NAME["gpu-two-pools"])
    c = pod_template(docs, "h100")["spec"]["containers"][0]
    env = env_of(c)
    assert env["DECODEBENCH_IMAGE"]["value"] == c["image"] and "@sha256:" in c["image"]
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_helm_test_checks_a_gpu_on_a_gpu_pool_when_asked():
    assert not find(render(VALUES_BY_NAME["gpu-two-pools"]), "Pod", "db-decodebench-gpu-doctor")  # opt-in
    on = {"helmTest": {"gpuDoctor": True}}
    (pod,) = find(render(VALUES_BY_NAME["gpu-two-pools"], on), "Pod", "db-decodebench-gpu-doctor")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["decodebench", "doctor", "--require-gpu"] and "decodebench-worker" in c["image"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # the first GPU pool
    (mig,) = find(render(MIG, on), "Pod", "db-decodebench-gpu-doctor")
    assert mig["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == 1
    # the pool's labels: Kueue admits the test pod through the pool's queue, as it admits the pool
    assert mig["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-batch"
    assert not find(render(VALUES_BY_NAME["cpu-only"], on), "Pod", "db-decodebench-gpu-doctor")
    (a10g,) = find(
        render(VALUES_BY_NAME["gpu-two-pools"], {"helmTest": {"gpuDoctor": True, "gpuPool": "a10g"}}),
        "Pod",
        "db-decodebench-gpu-doctor",
    )
    assert a10g["metadata"]["labels"]["decodebench.io/pool"] == "a10g"


def test_notes_list_what_must_exist_and_scale_only_manual_pools(tmp_path):
    notes = render_notes(VALUES_BY_NAME["gpu-two-pools"], tmp_path=tmp_path / "a")
    for line in (
        "Secret decodebench-s3 with keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY",
        "Secret hf-token with key token",
        "Secret ghcr-pull (image pull secret)",
        "PersistentVolumeClaim hf-cache-rwx",
        "PriorityClass batch-gpu-high",
    ):
        assert line in notes, line
    assert "decodebench cluster scale h100 --replicas 2" in notes
    keda = render_notes(VALUES_BY_NAME["deploy-md-keda"], tmp_path=tmp_path / "b")
    assert "cluster scale" not in keda  # every pool is KEDA's
    assert "scaledobjects.keda.sh" in keda and "KEDA scales h100, a10g" in keda
    mixed = render_notes(VALUES_BY_NAME["keda"], tmp_path=tmp_path / "c")
    assert "cluster scale a10g" in mixed and "cluster scale h100" not in mixed
