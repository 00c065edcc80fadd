"""The Helm chart: lint, render with realistic values, validate every manifest against the
Kubernetes OpenAPI schemas offline, and check what an operator relies on.

Helm comes from scripts/install-helm.sh (PyPI only); without it these tests fail, never skip.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "decodebench"
VALUES = sorted((ROOT / "tests" / "charts-values").glob("*.yaml"))
CASES = [None, *VALUES]
IDS = ["default", *(p.stem for p in VALUES)]
KUBE_VERSIONS = ("1.27.0", "1.32.0")  # the chart's oldest supported and the one helm renders for
SECRET_ENV = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "HF_TOKEN",
    "DECODEBENCH_REDIS_PASSWORD",
    "REDIS_PASSWORD",
    "REDISCLI_AUTH",
}

# KEDA's kinds are CRDs, outside the Kubernetes schemas: checked against this minimal schema
# of the fields the chart sets (from keda.sh/v1alpha1), not the full CRD.
_KEDA_META = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
KEDA_SCHEMAS = {
    "ScaledObject": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "metadata": _KEDA_META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["scaleTargetRef", "triggers"],
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "name": {"type": "string"},
                        },
                    },
                    "minReplicaCount": {"type": "integer", "minimum": 0},
                    "maxReplicaCount": {"type": "integer", "minimum": 1},
                    "pollingInterval": {"type": "integer", "minimum": 1},
                    "cooldownPeriod": {"type": "integer", "minimum": 0},
                    "advanced": {"type": "object"},
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["type", "metadata"],
                            "additionalProperties": False,
                            "properties": {
                                "type": {"const": "redis"},
                                "metadata": {
                                    "type": "object",
                                    "required": ["listName", "listLength"],
                                    "additionalProperties": {"type": "string"},
                                },
                                "authenticationRef": {"type": "object", "required": ["name"]},
                            },
                        },
                    },
                },
            },
        },
    },
    "TriggerAuthentication": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "metadata": _KEDA_META,
            "spec": {
                "type": "object",
                "required": ["secretTargetRef"],
                "properties": {
                    "secretTargetRef": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["parameter", "name", "key"],
                            "additionalProperties": False,
                            "properties": {k: {"type": "string"} for k in ("parameter", "name", "key")},
                        },
                    }
                },
            },
        },
    },
}


# --- helpers (also used by test_cluster.py) ---------------------------------------------


@functools.cache
def helm_binary() -> str:
    """Helm from $HELM, .tools/bin or PATH, else installed by scripts/install-helm.sh."""
    for candidate in (os.environ.get("HELM"), str(ROOT / ".tools" / "bin" / "helm"), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-helm.sh")], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.fail(f"helm is required and scripts/install-helm.sh failed:\n{proc.stderr}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


def helm(*args: str, chart: Path = CHART) -> subprocess.CompletedProcess:
    return subprocess.run(
        [helm_binary(), *[a.replace("{chart}", str(chart)) for a in args]], capture_output=True, text=True, timeout=120
    )


def _values_args(values: list[Path | dict | None]) -> list[str]:
    args = []
    for v in values:
        if isinstance(v, dict):
            fd, name = tempfile.mkstemp(prefix="decodebench-values-", suffix=".yaml")
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(v, f)
            v = Path(name)
        if v is not None:
            args += ["-f", str(v)]
    return args


def render(*values, release: str = "db", namespace: str = "ml", chart: Path = CHART) -> list[dict]:
    """`helm template` with the values files (or dicts); the manifests, parsed (a fresh copy each call)."""
    if all(v is None or isinstance(v, Path) for v in values):
        text = _template(values, release, namespace, chart)
    else:
        text = _template.__wrapped__(values, release, namespace, chart)
    return [doc for doc in yaml.safe_load_all(text) if doc]


@functools.cache
def _template(values: tuple, release: str, namespace: str, chart: Path) -> str:
    proc = helm(
        "template",
        release,
        "{chart}",
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSIONS[-1],
        *_values_args(list(values)),
        chart=chart,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render_error(*values) -> str:
    proc = helm("template", "db", "{chart}", *_values_args(list(values)))
    assert proc.returncode != 0, "helm template accepted values it should reject"
    return proc.stderr


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def workers(docs: list[dict]) -> dict[str, dict]:
    """Worker Deployments by pool name."""
    return {
        d["metadata"]["labels"]["decodebench.io/pool"]: d
        for d in find(docs, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    }


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def pod_specs(docs: list[dict]):
    for d in docs:
        if d["kind"] == "Pod":
            yield d["metadata"]["name"], d["spec"]
        elif d["kind"] in ("Deployment", "StatefulSet"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


# --- lint, render, validate --------------------------------------------------------------


@pytest.mark.parametrize("values", CASES, ids=IDS)
def test_lint_strict(values):
    proc = helm("lint", "--strict", "{chart}", *_values_args([values]))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("values", CASES, ids=IDS)
def test_manifests_match_kubernetes_schemas(values):
    docs = render(values)
    assert docs, "nothing rendered"
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in KEDA_SCHEMAS:
            jsonschema.validate(doc, KEDA_SCHEMAS[doc["kind"]])
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


FAKE_WORKER = """#!/bin/bash
echo "start $$ $*" >> "$LOG"
trap 'echo "term $$" >> "$LOG"; sleep 0.3; echo "done $$" >> "$LOG"; exit 0' TERM
[[ " $* " == *" --device ${CRASH_DEVICE:-none} "* ]] && { sleep 0.5; exit 3; }
while :; do sleep 0.05; done
"""


def _launch(tmp_path: Path, processes: int, crash: str | None = None):
    """Run the worker container's command from the rendered chart, with a fake decodebench-worker."""
    container = workers(render(VALUES_BY_NAME["gpu-two-pools"]))["h100"]["spec"]["template"]["spec"]["containers"][0]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "decodebench-worker").write_text(FAKE_WORKER)
    (bindir / "decodebench-worker").chmod(0o755)
    log = tmp_path / "workers.log"
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "LOG": str(log),
        "DECODEBENCH_WORKER_PROCESSES": str(processes),
        "DECODEBENCH_WORKER_DEVICE": "cuda",
        "CRASH_DEVICE": crash or "none",
    }
    proc = subprocess.Popen(
        [*container["command"], *container["args"]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _lines(log, "start") < processes:
        time.sleep(0.05)
    assert _lines(log, "start") == processes, log.read_text() if log.exists() else "no worker started"
    return proc, log


def _lines(log: Path, word: str) -> int:
    return sum(line.startswith(word) for line in log.read_text().splitlines()) if log.exists() else 0


def test_launcher_pins_one_process_per_gpu_and_drains_them_on_sigterm(tmp_path):
    proc, log = _launch(tmp_path, processes=8)
    starts = [line.split(" ", 2)[2] for line in log.read_text().splitlines() if line.startswith("start")]
    assert sorted(starts) == sorted(f"--device cuda:{i} --queues nlp-research safety" for i in range(8))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.stderr.read()
    # It exits only after every process has finished its job.
    assert _lines(log, "term") == 8 and _lines(log, "done") == 8


def test_launcher_stops_the_pod_when_one_worker_dies(tmp_path):
    proc, log = _launch(tmp_path, processes=4, crash="cuda:2")
    assert proc.wait(timeout=20) == 3
    assert _lines(log, "term") == 3 and _lines(log, "done") == 3  # the other three were drained
    assert "a worker exited with status 3" in proc.stderr.read()


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
    timeout = 7200 if values == VALUES_BY_NAME["gpu-two-pools"] else 3600
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
            if url and "@" in url["value"]:
                assert url["value"].split("://", 1)[1].startswith(":$(DECODEBENCH_REDIS_PASSWORD)@"), url
    # The only Secret the chart writes is the generated Redis password, used nowhere in clear.
    for secret in find(docs, "Secret"):
        assert secret["metadata"]["name"] == "db-decodebench-redis"
        assert secret["data"]["redis-password"] not in text.replace(secret["data"]["redis-password"], "", 1)


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
    assert not find(render(VALUES_BY_NAME["no-networkpolicy"]), "Secret")  # an existing Redis Secret is used


def test_network_policy_admits_only_this_release_to_redis():
    docs = render(None)
    (policy,) = find(docs, "NetworkPolicy")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    for name, d in ((d["metadata"]["name"], d) for d in docs if d["kind"] in ("Deployment", "Pod")):
        labels = d["metadata"]["labels"] if d["kind"] == "Pod" else d["spec"]["template"]["metadata"]["labels"]
        assert allowed.items() <= labels.items(), f"{name} could not reach Redis"
    keda = find(render(VALUES_BY_NAME["keda"]), "NetworkPolicy")[0]["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in keda
    assert not find(render(VALUES_BY_NAME["no-networkpolicy"]), "NetworkPolicy")


# --- Redis, KEDA, controller, test hook ----------------------------------------------------


def test_in_cluster_redis_keeps_an_append_only_file_behind_a_password():
    docs = render(None)
    (sts,) = find(docs, "StatefulSet")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    script = c["args"][0]
    assert "--appendonly yes" in script and "--maxmemory-policy noeviction" in script
    assert "requirepass" in script and "$REDIS_PASSWORD" not in script.split("exec redis-server", 1)[1]
    assert env_of(c)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "db-decodebench-redis"
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    assert c["image"].endswith("@sha256:bb186d083732f669da90be8b0f975a37812b15e913465bb14d845db72a4e3e08")
    (sts,) = find(render(VALUES_BY_NAME["cpu-only"]), "StatefulSet")
    assert "volumeClaimTemplates" not in sts
    assert {"name": "data", "emptyDir": {}} in sts["spec"]["template"]["spec"]["volumes"]


def test_external_redis_replaces_the_statefulset():
    docs = render(VALUES_BY_NAME["external-redis"])
    assert not find(docs, "StatefulSet") and not find(docs, "Service") and not find(docs, "NetworkPolicy")
    env = env_of(workers(docs)["l4"]["spec"]["template"]["spec"]["containers"][0])
    assert (
        env["DECODEBENCH_REDIS_URL"]["value"]
        == "rediss://:$(DECODEBENCH_REDIS_PASSWORD)@redis.platform.internal:6380/2"
    )
    assert env["DECODEBENCH_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "platform-redis",
        "key": "password",
    }
    (so,) = find(docs, "ScaledObject")
    meta = so["spec"]["triggers"][0]["metadata"]
    assert (meta["address"], meta["enableTLS"], meta["databaseIndex"]) == ("redis.platform.internal:6380", "true", "2")


def test_keda_scales_each_autoscaled_pool_on_its_queues():
    docs = render(VALUES_BY_NAME["keda"])
    pools = workers(docs)
    (so,) = find(docs, "ScaledObject")
    assert so["spec"]["scaleTargetRef"]["name"] == pools["h100"]["metadata"]["name"]
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (0, 8)
    assert [t["metadata"]["listName"] for t in so["spec"]["triggers"]] == [
        f"rq:queue:decodebench.{t}.{p}" for t in ("team-a", "team-b") for p in ("high", "normal", "low")
    ]
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
    assert (
        env["DECODEBENCH_REDIS_URL"]["value"]
        == "redis://:$(DECODEBENCH_REDIS_PASSWORD)@db-decodebench-redis.ml.svc:6379/0"
    )
    assert env["DECODEBENCH_STORE"]["value"] == "s3://decodebench/runs"
    assert env["DECODEBENCH_S3_ENDPOINT_URL"]["value"] == "http://minio.minio.svc:9000"
    assert env["AWS_REGION"]["value"] == "us-east-1"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "minio-credentials"
    assert (env["DECODEBENCH_TENANT"]["value"], env["DECODEBENCH_LOG_FORMAT"]["value"]) == ("default", "json")
    assert env["DECODEBENCH_RELEASE"]["value"] == "db"
    assert spec["serviceAccountName"] == "db-decodebench-controller"
    (role,) = find(docs, "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
    ]
    (binding,) = find(docs, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "db-decodebench-controller", "namespace": "ml"}]
    bare = render(VALUES_BY_NAME["no-networkpolicy"])
    assert not find(bare, "Role") and not find(bare, "Deployment", "db-decodebench-controller")


def test_helm_test_hook_runs_doctor_in_the_cluster():
    (pod,) = find(render(None), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    assert c["args"] == ["doctor"] and "decodebench-controller" in c["image"]
    assert {"DECODEBENCH_REDIS_URL", "DECODEBENCH_STORE"} <= env_of(c).keys()


def test_notes_tell_how_to_submit_a_first_sweep(tmp_path):
    # helm renders NOTES.txt only on install; render it here through a ConfigMap in a copy of the chart.
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "notes-preview.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | quote }}}\n'
    )
    (cm,) = find(render(VALUES_BY_NAME["gpu-two-pools"], chart=chart), "ConfigMap", "notes")
    notes = cm["data"]["notes"]
    assert "decodebench submit /tmp/sweep.yaml" in notes and "helm test db -n ml" in notes
    assert "h100: 2 pod(s), 8 x nvidia.com/gpu each, tenants: nlp-research, safety" in notes
    assert "deploy/db-decodebench-controller -- decodebench cluster status" in notes


# --- bad values fail with a readable message -------------------------------------------------

BAD_VALUES = {
    "internal-and-external-redis": (
        {"redis": {"enabled": True, "external": {"url": "redis://r.example:6379/0"}}},
        "set either redis.enabled=true (Redis in the cluster) or redis.external.url",
    ),
    "no-redis": ({"redis": {"enabled": False}}, "set redis.enabled=true (Redis in the cluster) or redis.external.url"),
    "negative-replicas": (
        {"worker": {"pools": [{"name": "gpu", "replicas": -1}]}},
        "worker.pools.0.replicas: Must be greater than or equal to 0",
    ),
    "unknown-pool-field": (
        {"worker": {"pools": [{"name": "gpu", "gpu": 2}]}},
        "worker.pools.0: Additional property gpu is not allowed",
    ),
    "pool-without-name": ({"worker": {"pools": [{"gpus": 2}]}}, "worker.pools.0: name is required"),
    "duplicate-pools": ({"worker": {"pools": [{"name": "gpu"}, {"name": "gpu"}]}}, 'the pool name "gpu" appears twice'),
    "credentials-in-redis-url": (
        {"redis": {"enabled": False, "external": {"url": "redis://:hunter2@r.example:6379/0"}}},
        "redis.external.url: Does not match pattern",
    ),
    "autoscaling-all-tenants": (
        {"worker": {"pools": [{"name": "gpu", "autoscaling": {"enabled": True}}]}},
        "worker.pools[0] (gpu): autoscaling watches named queues, so `queues` must list tenants",
    ),
    "min-above-max": (
        {
            "worker": {
                "pools": [
                    {
                        "name": "gpu",
                        "queues": ["a"],
                        "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2},
                    }
                ]
            }
        },
        "autoscaling.minReplicas (5) is above autoscaling.maxReplicas (2)",
    ),
    "unpinned-digest": ({"worker": {"image": {"digest": "latest"}}}, "worker.image.digest: Does not match pattern"),
    "typo-in-section": (
        {"store": {"bucket": "b", "acessKey": "x"}},
        "store: Additional property acessKey is not allowed",
    ),
}


@pytest.mark.parametrize("case", BAD_VALUES, ids=list(BAD_VALUES))
def test_bad_values_fail_with_a_readable_message(case):
    values, message = BAD_VALUES[case]
    err = render_error(values)
    assert message in err, err
    assert "goroutine" not in err and len(err.splitlines()) < 10


# --- conventions -----------------------------------------------------------------------------


def test_every_value_has_a_doc_comment():
    """helm-docs style: each leaf value is documented by a `# --` comment on itself or a parent key."""
    undocumented, stack, pending = [], [], False
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys = []
    for line in lines:
        if line.strip().startswith("# --"):
            pending = True
            continue
        m = re.match(r"^(\s*)([A-Za-z][\w.-]*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        documented = pending or any(d for _, _, d in stack)
        keys.append((indent, ".".join([k for _, k, _ in stack] + [key]), documented, rest))
        stack.append((indent, key, pending))
        pending = False
    for i, (indent, path, documented, rest) in enumerate(keys):
        is_leaf = rest != "" or i + 1 == len(keys) or keys[i + 1][0] <= indent
        if is_leaf and not documented:
            undocumented.append(path)
    assert not undocumented, f"values without a `# --` comment: {undocumented}"


def test_chart_metadata_and_schema():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "decodebench"
    schema = CHART / "values.schema.json"
    assert schema.exists()
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    for name in ("decodebench.name", "decodebench.fullname", "decodebench.labels"):
        assert f'define "{name}"' in helpers


VALUES_BY_NAME = {p.stem: p for p in VALUES}
assert {"gpu-two-pools", "cpu-only", "external-redis", "keda", "no-networkpolicy"} <= VALUES_BY_NAME.keys()


def test_values_files_are_documented():
    for path in VALUES:
        first = path.read_text().splitlines()[0]
        assert first.startswith("#"), f"{path.name}: say in a first comment what cluster it describes"
