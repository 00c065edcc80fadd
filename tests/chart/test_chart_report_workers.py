"""The chart's report workers (`reportWorkers`, issue 25 item 7): the Deployment that runs
`decodebench report-worker`, its KEDA ScaledObject on the report queues, its NetworkPolicy and its
values; and the rendered container itself, run as a subprocess against a redis-server with the
deployment's ACL and the moto S3 store, computing the cells of a real `decodebench report --distributed`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from redis import Redis
from rq import Queue
from rq.registry import StartedJobRegistry

from controller.cli import main as cli
from controller.report.compute import celljob
from controller.report.distribute.signer import REPORT_TIMEOUT_S
from tests.support.acl import ADMIN_PW
from tests.support.chart import (
    SECRET_ENV,
    VALUES_BY_NAME,
    env_of,
    find,
    password_file_secret,
    render,
    render_error,
    render_notes,
    validate_keda,
)
from tests.support.keda import desired_replicas, evaluate
from tests.support.repo import REPO
from tests.support.report import CELLS, make_sweep, write_with_hashes
from worker.core import keys
from worker.store import open_store

VALUES = VALUES_BY_NAME["report-workers"]  # team-a (max_running 4), team-b; KEDA, 2 cells per pod, 6 pods at most
NAME = "db-decodebench-report-worker"
BIN = Path(sys.executable).parent


def deployment(docs: list[dict]) -> dict:
    (dep,) = find(docs, "Deployment", NAME)
    return dep


def container_of(dep: dict) -> dict:
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container


def is_report_worker(doc: dict) -> bool:
    return doc["metadata"]["labels"].get("app.kubernetes.io/component") == "report-worker"


# --- off by default, values ---------------------------------------------------------------------


def test_off_by_default_renders_nothing():
    docs = render(None)
    assert not [d for d in docs if is_report_worker(d)] and not find(docs, "ScaledObject")
    (redis_policy,) = find(docs, "NetworkPolicy", "db-decodebench-redis")
    (expr,) = redis_policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
    assert "report-worker" not in expr["values"]


BAD = {
    "unknown-key": ({"reportWorkers": {"enabled": True, "replica": 2}}, "Additional property replica is not allowed"),
    "negative-replicas": ({"reportWorkers": {"replicas": -1}}, "reportWorkers.replicas: Must be greater than or equal"),
    "bad-tenant": ({"reportWorkers": {"queues": ["team a"]}}, "reportWorkers.queues.0: Does not match pattern"),
    "unknown-autoscaling-key": (
        {"reportWorkers": {"autoscaling": {"countScheduled": True}}},
        "Additional property countScheduled is not allowed",
    ),
    "autoscaling-all-tenants": (
        {"reportWorkers": {"enabled": True, "autoscaling": {"enabled": True}}},
        'reportWorkers: autoscaling watches named queues, so `queues` must list tenants, not "*"',
    ),
    "min-above-max": (
        {
            "reportWorkers": {
                "enabled": True,
                "queues": ["a"],
                "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 2},
            }
        },
        "reportWorkers: autoscaling.minReplicas (3) is above autoscaling.maxReplicas (2)",
    ),
    "pool-named-like-them": (  # `decodebench cluster` lists the report workers as the pool `report-workers`
        {"reportWorkers": {"enabled": True}, "worker": {"pools": [{"name": "report-workers"}]}},
        'the pool name "report-workers" is the report workers\' (reportWorkers)',
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_report_worker_values_fail_with_a_readable_message(case):
    values, message = BAD[case]
    err = render_error(values)
    assert message in err, err
    assert "goroutine" not in err and len(err.splitlines()) < 10


def test_notes_name_the_report_workers_and_what_they_need(tmp_path):
    notes = render_notes(VALUES, tmp_path=tmp_path)
    assert "Report workers (decodebench report-worker, CPU only" in notes and "0..6 pods (KEDA)" in notes
    assert "scaledobjects.keda.sh" in notes  # no GPU pool autoscales here: KEDA is for the report workers
    assert "Secret decodebench-keda-redis with key password (Redis user keda)" in notes
    assert "decodebench report <SWEEP_ID> --distributed" in notes
    assert "Report workers" not in render_notes(None, tmp_path=tmp_path / "default")


def test_the_values_in_docs_deploy_md_render():
    section = (REPO / "docs" / "deploy.md").read_text().split("## 8c. Report workers", 1)[1]
    values = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    docs = render(None, values)
    assert deployment(docs) and [so["metadata"]["name"] for so in find(docs, "ScaledObject")] == [NAME]


def test_with_tenants_the_queues_must_be_declared_tenants():
    err = render_error(VALUES, {"reportWorkers": {"queues": ["team-a", "team-c"]}})
    assert 'reportWorkers.queues: tenant "team-c" is not in tenants.tenants (team-a, team-b)' in err, err


# --- the Deployment -----------------------------------------------------------------------------


def test_the_deployment_runs_one_report_worker_with_the_workers_credentials():
    docs = render(VALUES)
    dep = deployment(docs)
    spec = dep["spec"]["template"]["spec"]
    c = container_of(dep)
    assert c["command"] == ["decodebench"] and c["args"] == ["report-worker", "team-a", "team-b"]
    assert c["image"].startswith("registry.example/decodebench-controller:0.1.0@sha256:")  # the controller image
    assert "replicas" not in dep["spec"]  # KEDA owns the count
    env = env_of(c)
    assert env["DECODEBENCH_REDIS_URL"]["value"] == "redis://worker@db-decodebench-redis.ml.svc:6379/0"
    assert password_file_secret(spec, c) == {"secretName": "decodebench-worker-redis", "key": "password"}
    assert env["DECODEBENCH_STORE"]["value"] == "s3://ml-decodebench/runs"
    assert env["DECODEBENCH_S3_ENDPOINT_URL"]["value"] == "http://minio.minio.svc:9000"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "decodebench-s3"
    assert all("value" not in e for name, e in env.items() if name in SECRET_ENV)
    assert env["DECODEBENCH_TENANTS_FILE"]["value"] == "/etc/decodebench/tenants.yaml"
    assert env["DECODEBENCH_SIGNING_KEY_FILE"]["value"] == "/etc/decodebench-signing/key"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["signing-key"]["secret"]["secretName"] == "decodebench-signing"
    assert volumes["tenants"]["configMap"]["name"] == "db-decodebench-tenants"
    assert set(volumes) == {"tmp", "redis-password", "signing-key", "tenants"}  # no model cache, no /dev/shm
    assert "checksum/tenants" in dep["spec"]["template"]["metadata"]["annotations"]  # read at start
    assert "HF_TOKEN" not in env and "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert c["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert env["DECODEBENCH_LOG_LEVEL"]["value"] == "info"  # extraEnv
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "c7i.4xlarge"} and "tolerations" not in spec
    assert dep["spec"]["template"]["metadata"]["labels"]["team"] == "platform"
    # A running cell may finish on SIGTERM: a report job's timeout, and the pod waits a little longer.
    assert env["DECODEBENCH_STOP_GRACE"]["value"] == str(REPORT_TIMEOUT_S)
    assert spec["terminationGracePeriodSeconds"] > REPORT_TIMEOUT_S
    # Non-root, read-only root, nothing of the Kubernetes API.
    assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    (pdb,) = find(docs, "PodDisruptionBudget", NAME)
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "report-worker"


def test_without_tenants_it_logs_in_with_the_one_password_and_takes_every_queue():
    dep = deployment(render(None, {"reportWorkers": {"enabled": True, "replicas": 3}}))
    c = container_of(dep)
    assert c["args"] == ["report-worker", "*"] and dep["spec"]["replicas"] == 3
    assert c["image"] == "ghcr.io/decodebench/decodebench-controller:0.1.0"
    env = env_of(c)
    assert env["DECODEBENCH_REDIS_URL"]["value"] == "redis://db-decodebench-redis.ml.svc:6379/0"
    assert "DECODEBENCH_TENANTS_FILE" not in env and "annotations" not in dep["spec"]["template"]["metadata"]


def probe(c: dict, which: str, beats: Path) -> subprocess.CompletedProcess:
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env["DECODEBENCH_HEARTBEAT_DIR"] = str(beats)
    return subprocess.run(c[which]["exec"]["command"], env=env, capture_output=True, text=True, timeout=10)


def test_the_probes_read_the_heartbeat_file_the_report_worker_touches(tmp_path):
    """ReportLogic.touch (every beat, busy or idle) writes the file the rendered probes read."""
    from controller.report.distribute.mapworker import ReportLogic

    c = container_of(deployment(render(VALUES)))
    env = env_of(c)
    beat = Path(env["DECODEBENCH_HEARTBEAT_FILE"]["value"])
    assert beat.parent == Path(env["DECODEBENCH_HEARTBEAT_DIR"]["value"]) and beat.name == "worker-0"
    here = tmp_path / "beats" / beat.name  # the folder does not exist yet: the pod's /tmp starts empty
    for which in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probe(c, which, here.parent).returncode != 0
    ReportLogic(["team-a"], store=None, key=b"k", max_job_bytes=1, heartbeat_file=str(here)).touch()
    assert here.exists()
    for which in ("startupProbe", "livenessProbe", "readinessProbe"):
        proc = probe(c, which, here.parent)
        assert proc.returncode == 0 and "1/1 worker processes beating" in proc.stdout, proc.stdout + proc.stderr
    os.utime(here, (0, 0))  # a beat long ago: the process is stuck
    assert probe(c, "livenessProbe", here.parent).returncode != 0


# --- KEDA ---------------------------------------------------------------------------------------


def report_waiting(t: str) -> str:
    return f"rq:queue:decodebench.{t}.report"


def report_running(t: str) -> str:
    return f"rq:wip:decodebench.{t}.report"


@pytest.fixture(scope="module")
def scaled_object() -> dict:
    (so,) = find(render(VALUES), "ScaledObject")
    validate_keda(so)
    return so


@pytest.mark.parametrize(
    ("state", "current", "expected"),
    [
        # 10 cells of team-a waiting: 5 pods at 2 cells a pod. team-a's max_running (4) is not applied:
        # report jobs take no slots (a GPU pool would count 4 of them).
        ({report_waiting("team-a"): 10}, 0, 5),
        # Both tenants, waiting and running: 3 + 2 + 4 + 1 = 10 cells, 5 pods.
        (
            {
                report_waiting("team-a"): 3,
                report_running("team-a"): 2,
                report_waiting("team-b"): 4,
                report_running("team-b"): 1,
            },
            2,
            5,
        ),  # fmt: skip
        # One cell running, nothing waiting: the pod stays.
        ({report_running("team-b"): 1}, 1, 1),
        # Nothing: back to minReplicas (0).
        ({}, 2, 0),
        # More than 6 pods can take: clamped.
        ({report_waiting("team-b"): 100}, 1, 6),
        # GPU jobs of the same tenants do not start a report worker.
        ({"rq:queue:decodebench.team-a.normal": 50, "rq:wip:decodebench.team-b.high": 8}, 0, 0),
    ],
)
def test_report_workers_scale_on_their_tenants_report_cells(scaled_object, state, current, expected):
    assert desired_replicas(scaled_object, state, current) == expected


def test_the_scaled_object_counts_each_report_key_once_as_the_keda_user(scaled_object):
    spec = scaled_object["spec"]
    assert spec["scaleTargetRef"]["name"] == NAME
    lists = sorted(t["metadata"]["listName"] for t in spec["triggers"])
    assert lists == sorted(f(t) for t in ("team-a", "team-b") for f in (report_waiting, report_running))
    assert {t["metadata"]["username"] for t in spec["triggers"]} == {"keda"}
    assert {t["authenticationRef"]["name"] for t in spec["triggers"]} == {"db-decodebench-redis-keda"}
    names = {t["name"] for t in spec["triggers"]}
    assert evaluate(spec["advanced"]["scalingModifiers"]["formula"], dict.fromkeys(names, 1)) == 4
    # The keys are RQ's, and KEDA's Redis user may count them.
    conn = Redis()  # no connection is made: only key names are built
    for t in ("team-a", "team-b"):
        name = keys.report_queue(t)
        assert Queue(name, connection=conn).key == report_waiting(t)
        assert StartedJobRegistry(name, connection=conn).key == report_running(t)
        for key in (report_waiting(t), report_running(t)):
            assert any(fnmatch(key, pattern) for pattern in keys.keda_acl_keys()), key
    docs = render(VALUES)
    (auth,) = find(docs, "TriggerAuthentication")  # made for the report workers: no GPU pool autoscales here
    assert auth["spec"]["secretTargetRef"][0]["name"] == "decodebench-keda-redis"
    (config,) = find(docs, "ConfigMap", "db-decodebench-tenants")
    assert "keda" in yaml.safe_load(config["data"]["tenants.yaml"])  # Redis gets its `keda` user


# --- NetworkPolicy ------------------------------------------------------------------------------


def selects(selector: dict, labels: dict) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def test_report_workers_reach_redis_and_s3_only_and_take_no_connections():
    docs = render(VALUES)  # MinIO on 9000: 443 would be the Hub
    labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    policies = find(docs, "NetworkPolicy")
    (redis_policy,) = [p for p in policies if p["metadata"]["name"] == "db-decodebench-redis"]
    assert any(selects(peer["podSelector"], labels) for peer in redis_policy["spec"]["ingress"][0]["from"])
    mine = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
    assert [p["metadata"]["name"] for p in mine] == [NAME]  # not the GPU workers' (and their Hub egress)
    (policy,) = mine
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["ingress"] == []
    ports = {(p["protocol"], p["port"]) for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}
    assert ports == {("UDP", 53), ("TCP", 53), ("TCP", 6379), ("TCP", 9000)}
    redis_rule = next(r for r in policy["spec"]["egress"] if {"protocol": "TCP", "port": 6379} in r["ports"])
    assert redis_rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    keda_peer = redis_policy["spec"]["ingress"][0]["from"][1]  # KEDA's operator reads the report queues
    assert keda_peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "keda-operator"}


# --- the rendered container, run ----------------------------------------------------------------


def pod_env(docs: list[dict], acl: dict, s3_endpoint: str, bucket: str, tmp_path: Path) -> dict[str, str]:
    """The container's environment as the pod would see it, each cluster address replaced by its stand-in:
    Redis's host (the `worker` user kept), the store's bucket and endpoint, the mounted files under tmp_path
    (the Secrets' and the tenants ConfigMap's contents), the pod's /tmp."""
    c = container_of(deployment(docs))
    files = {
        "/run/secrets/decodebench-redis/password": acl["passwords"]["worker"],
        "/etc/decodebench-signing/key": Path(os.environ["DECODEBENCH_SIGNING_KEY_FILE"]).read_text(),
        "/etc/decodebench/tenants.yaml": find(docs, "ConfigMap", "db-decodebench-tenants")[0]["data"]["tenants.yaml"],
    }
    env = {"PATH": os.environ["PATH"]}
    for e in c["env"]:
        name, value = e["name"], e.get("value")
        if "valueFrom" in e:  # the S3 Secret's keys, the downward API
            value = os.environ.get(name, "stand-in")
        elif value in files:
            path = tmp_path / "mounts" / value.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[value])
            value = str(path)
        elif value.startswith("/tmp"):
            value = str(tmp_path / "pod-tmp") + value[len("/tmp") :]
        env[name] = value
    host = "db-decodebench-redis.ml.svc:6379"
    assert host in env["DECODEBENCH_REDIS_URL"] and "worker@" in env["DECODEBENCH_REDIS_URL"]
    env["DECODEBENCH_REDIS_URL"] = env["DECODEBENCH_REDIS_URL"].replace(host, f"127.0.0.1:{acl['port']}")
    env["DECODEBENCH_STORE"] = env["DECODEBENCH_STORE"].replace("s3://ml-decodebench/", f"s3://{bucket}/")
    env["DECODEBENCH_S3_ENDPOINT_URL"] = s3_endpoint
    env["DECODEBENCH_LOG_FORMAT"] = "json"
    return env


def test_the_rendered_report_worker_computes_the_cells_of_a_distributed_report(
    acl, s3_endpoint, s3_bucket, tmp_path, monkeypatch
):
    """The container's command, args and environment from the chart, run as the pod would run them:
    logged in as `worker` on a redis-server with the deployment's ACL, reading the moto S3 store; the
    operator's `decodebench report --distributed` for team-a gets every cell from it."""
    docs = render(VALUES)
    c = container_of(deployment(docs))
    env = pod_env(docs, acl, s3_endpoint, s3_bucket, tmp_path)
    url = env["DECODEBENCH_STORE"]
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS, tenant="team-a")
    write_with_hashes(open_store(url), data)
    here: list[str] = []
    real = celljob.run_cell
    monkeypatch.setattr(celljob, "run_cell", lambda task, *a: here.append(task.cell) or real(task, *a))
    command = [str(BIN / c["command"][0]), *c["args"]]
    worker = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        admin = f"redis://admin:{ADMIN_PW}@127.0.0.1:{acl['port']}/0"  # the operator's login
        args = ["report", data.sweep_id, "--distributed", "--tenant", "team-a", "--n-boot", "50"]
        r = CliRunner().invoke(cli, [*args, "--store", url, "--redis-url", admin, "--wait-s", "90"])
        assert r.exit_code == 0, r.output
        assert here == []  # every cell came from the report worker
        beats = Path(env["DECODEBENCH_HEARTBEAT_DIR"])
        proc = probe({**c, "env": [{"name": k, "value": v} for k, v in env.items()]}, "livenessProbe", beats)
        assert proc.returncode == 0, proc.stdout
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    jobs = [x for x in lines if x.get("event") == "report_worker.job"]
    cell_jobs = [j for j in jobs if j["job_id"].startswith("cell-")]
    pair_jobs = [j for j in jobs if j["job_id"].startswith("pair-")]  # each cell against its model's first: m's 2
    assert len(cell_jobs) == len(CELLS) and len(pair_jobs) == 2 and len(jobs) == len(cell_jobs) + len(pair_jobs)
    assert not any(j["refused"] for j in jobs) and {j["tenant"] for j in jobs} == {"team-a"}
    assert [x["jobs_run"] for x in lines if x.get("event") == "report_worker.stopped"] == [len(jobs)]
    assert acl["admin"].acl_log() == []  # the `worker` user was refused nothing


@pytest.mark.parametrize("ttl", ["60", "90.5", "1e2"])
def test_the_heartbeat_probe_reads_any_ttl_the_worker_takes(tmp_path, ttl):
    """The worker takes any float TTL; the probe cut it at the dot, so `1e2` was a bash arithmetic error and the
    pod never ready."""
    from tests.support.repo import REPO

    script = (REPO / "charts" / "decodebench" / "files" / "probe-heartbeats.sh").read_text()
    (tmp_path / "worker-0").touch()
    env = {"DECODEBENCH_HEARTBEAT_DIR": str(tmp_path), "DECODEBENCH_HEARTBEAT_TTL": ttl, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["/bin/bash", "-c", script, "probe", "all"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "1/1 worker processes beating\n" and not proc.stderr, proc
