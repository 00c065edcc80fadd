"""The chart with tenants (docs/tenants.md, "What the Helm chart renders"): the tenants file as a
ConfigMap the workers read, Redis's ACL users rendered by an init container from the Secrets,
workers as `worker`, KEDA as `keda`, the controller as its tenant, and values that cannot work
refused in one message. One test runs the rendered init container's script and the rendered
redis.conf for real: `decodebench tenants acl` with the Secrets' passwords, then redis-server.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from tests.helpers_chart import VALUES_BY_NAME, env_of, find, password_file_secret, render, render_error, workers
from tests.services import free_port
from worker.core import keys

TENANTS = VALUES_BY_NAME["tenants"]
ROOT = Path(__file__).resolve().parents[1]


def statefulset(docs) -> dict:
    (sts,) = find(docs, "StatefulSet")
    return sts["spec"]["template"]["spec"]


def test_the_tenants_file_is_a_configmap_the_workers_read():
    docs = render(TENANTS)
    (cm,) = find(docs, "ConfigMap", "db-decodebench-tenants")
    rendered = yaml.safe_load(cm["data"]["tenants.yaml"])
    values = yaml.safe_load(TENANTS.read_text())["tenants"]
    assert rendered == values  # the same shape, as the values give it
    pod = workers(docs)["gpu"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    path = env_of(c)["DECODEBENCH_TENANTS_FILE"]["value"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "tenants"]
    assert path == mount["mountPath"] + "/tenants.yaml"
    assert {"name": "tenants", "configMap": {"name": "db-decodebench-tenants"}} in pod["volumes"]
    # Without tenants there is no tenants file.
    assert not find(render(None), "ConfigMap", "db-decodebench-tenants")
    assert "DECODEBENCH_TENANTS_FILE" not in env_of(
        workers(render(None))["gpu"]["spec"]["template"]["spec"]["containers"][0]
    )


def test_each_program_logs_in_as_its_acl_user_with_the_password_from_a_file():
    docs = render(TENANTS)
    pod = workers(docs)["gpu"]["spec"]["template"]["spec"]
    env = env_of(pod["containers"][0])
    assert env["DECODEBENCH_REDIS_URL"]["value"] == "redis://worker@db-decodebench-redis.ml.svc:6379/0"
    assert password_file_secret(pod, pod["containers"][0]) == {
        "secretName": "decodebench-worker-redis",
        "key": "password",
    }
    (ctl,) = find(docs, "Deployment", "db-decodebench-controller")
    spec = ctl["spec"]["template"]["spec"]
    assert env_of(spec["containers"][0])["DECODEBENCH_REDIS_URL"]["value"].startswith("redis://team-a@")
    assert password_file_secret(spec, spec["containers"][0]) == {"secretName": "team-a-redis", "key": "password"}
    (auth,) = find(docs, "TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "decodebench-keda-redis", "key": "password"}
    ]
    (so,) = find(docs, "ScaledObject")
    assert {t["metadata"]["username"] for t in so["spec"]["triggers"]} == {"keda"}
    assert not find(docs, "Secret")  # no generated shared password: every user has its own Secret


def test_redis_loads_the_acl_file_its_init_container_renders():
    docs = render(TENANTS)
    spec = statefulset(docs)
    (init,) = spec["initContainers"]
    assert init["command"][:2] == ["/bin/sh", "-c"] and "decodebench tenants acl" in init["args"][0]
    secret_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"] if "valueFrom" in e}
    assert secret_env == {
        "TEAM_A_REDIS_PASSWORD": {"name": "team-a-redis", "key": "password"},
        "TEAM_B_REDIS_PASSWORD": {"name": "team-b-redis", "key": "password"},
        "RESEARCH_X_REDIS_PASSWORD": {"name": "research-x-redis", "key": "password"},
        "WORKER_REDIS_PASSWORD": {"name": "decodebench-worker-redis", "key": "password"},
        "KEDA_REDIS_PASSWORD": {"name": "decodebench-keda-redis", "key": "password"},
    }
    acl_volume = next(v for v in spec["volumes"] if v["name"] == "acl")
    assert "emptyDir" in acl_volume
    (conf,) = find(docs, "ConfigMap", "db-decodebench-redis")
    assert "aclfile /etc/redis-acl/users.acl" in conf["data"]["redis.conf"].splitlines()
    redis_c = spec["containers"][0]
    assert "requirepass" not in " ".join(redis_c["command"] + redis_c.get("args", []))
    assert "--user worker" in redis_c["readinessProbe"]["exec"]["command"][2]
    exporter = env_of(spec["containers"][1])
    assert exporter["REDIS_USER"]["value"] == "worker"
    assert exporter["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "decodebench-worker-redis"
    # Without tenants: the one password, requirepass, no init container, no aclfile.
    plain = render(None)
    assert "initContainers" not in statefulset(plain)
    assert "aclfile" not in find(plain, "ConfigMap", "db-decodebench-redis")[0]["data"]["redis.conf"]


def _run_init_container(docs, tmp_path: Path, passwords: dict[str, str]) -> Path:
    """The init container's script, run here: its paths moved under tmp_path, each variable set from
    its Secret as Kubernetes would. Returns the folder of users.acl."""
    spec = statefulset(docs)
    (init,) = spec["initContainers"]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    (cm,) = find(docs, "ConfigMap", "db-decodebench-tenants")
    (tmp_path / "tenants").mkdir()
    (tmp_path / "tenants" / "tenants.yaml").write_text(cm["data"]["tenants.yaml"])
    (tmp_path / "acl").mkdir()
    script = init["args"][0].replace(mounts["tenants"], str(tmp_path / "tenants"))
    script = script.replace(mounts["acl"], str(tmp_path / "acl"))
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    for e in init["env"]:
        env[e["name"]] = passwords[e["valueFrom"]["secretKeyRef"]["name"]] if "valueFrom" in e else e["value"]
    proc = subprocess.run([*init["command"], script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not any(p in proc.stdout + proc.stderr for p in passwords.values())
    return tmp_path / "acl"


def test_the_rendered_init_container_and_redis_conf_confine_a_tenant_on_a_real_redis(tmp_path):
    docs = render(TENANTS)
    secret_names = ["team-a-redis", "team-b-redis", "research-x-redis", "decodebench-worker-redis"]
    passwords = {s: "canary-" + secrets.token_hex(12) for s in [*secret_names, "decodebench-keda-redis"]}
    acl_dir = _run_init_container(docs, tmp_path, passwords)
    users_acl = (acl_dir / "users.acl").read_text()
    assert not any(p in users_acl for p in passwords.values())  # hashes only
    (conf,) = find(docs, "ConfigMap", "db-decodebench-redis")
    port = free_port()
    text = conf["data"]["redis.conf"].replace("port 6379", f"port {port}").replace("dir /data", f"dir {tmp_path}")
    text = text.replace("/etc/redis-acl", str(acl_dir))
    (tmp_path / "redis.conf").write_text(text + "bind 127.0.0.1\n")
    server = subprocess.Popen(["redis-server", str(tmp_path / "redis.conf")], stdout=subprocess.DEVNULL)
    try:
        team_a = redis.Redis(port=port, username="team-a", password=passwords["team-a-redis"])
        for _ in range(100):
            try:
                team_a.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        mine, theirs = keys.rq_queue_key(keys.queue_name("team-a")), keys.rq_queue_key(keys.queue_name("team-b"))
        team_a.rpush(mine, "job-1")
        assert team_a.llen(mine) == 1
        for call in (lambda: team_a.llen(theirs), lambda: team_a.rpush(theirs, "x"), lambda: team_a.flushall()):
            with pytest.raises(redis.ResponseError, match="NOPERM|no permissions|unknown command"):
                call()
        with pytest.raises(redis.AuthenticationError):  # another tenant's password is not team-a's
            redis.Redis(port=port, username="team-a", password=passwords["team-b-redis"]).ping()
        with pytest.raises(redis.AuthenticationError):  # the default user is off
            redis.Redis(port=port).ping()
        worker = redis.Redis(port=port, username="worker", password=passwords["decodebench-worker-redis"])
        assert worker.llen(mine) == 1 and worker.acl_whoami() == "worker"
        keda = redis.Redis(port=port, username="keda", password=passwords["decodebench-keda-redis"])
        assert keda.llen(mine) == 1
        with pytest.raises(redis.ResponseError, match="NOPERM|no permissions"):
            keda.lrange(mine, 0, -1)
        # The readiness probe, as rendered, passes with the worker's password file.
        (tmp_path / "pw").write_text(passwords["decodebench-worker-redis"])
        probe = statefulset(docs)["containers"][0]["readinessProbe"]["exec"]["command"]
        probe_cmd = probe[2].replace("/run/secrets/redis/password", str(tmp_path / "pw"))
        probe_cmd = probe_cmd.replace("-h 127.0.0.1", f"-h 127.0.0.1 -p {port}")
        assert subprocess.run([*probe[:2], probe_cmd], timeout=30).returncode == 0
    finally:
        server.terminate()
        server.wait(timeout=10)


BAD = {
    "no-secret": (
        {"tenants": {"tenants": [{"name": "team-a", "redis_password_env": "A_PW"}]}},
        "set redis_password_env and secrets.redis",
    ),
    "no-worker-secret": (
        {
            "tenant": "team-a",
            "tenants": {"tenants": [{"name": "team-a", "redis_password_env": "A_PW", "secrets": {"redis": "a"}}]},
        },
        "set tenants.worker.secret",
    ),
    "controller-tenant": (
        {
            "tenant": "team-z",
            "tenants": {
                "tenants": [{"name": "team-a", "redis_password_env": "A_PW", "secrets": {"redis": "a"}}],
                "worker": {"secret": "w"},
                "keda": {"secret": "k"},
            },
        },
        "`tenant` (team-z) must be one of tenants.tenants (team-a)",
    ),
    "same-variable": (
        {
            "tenant": "team-a",
            "tenants": {
                "tenants": [
                    {"name": "team-a", "redis_password_env": "WORKER_REDIS_PASSWORD", "secrets": {"redis": "a"}}
                ],
                "worker": {"secret": "w"},
                "keda": {"secret": "k"},
            },
        },
        "WORKER_REDIS_PASSWORD is already the variable of team-a",
    ),
    "inline-password": (
        {"tenants": {"tenants": [{"name": "team-a", "password": "hunter2"}]}},
        "Additional property password is not allowed",
    ),
    "slash-in-name": ({"tenants": {"tenants": [{"name": "team/a"}]}}, "tenants.tenants.0.name: Does not match pattern"),
    "zero-weight": ({"tenants": {"tenants": [{"name": "a", "weight": 0}]}}, "tenants.tenants.0.weight"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_values_that_cannot_work_fail_with_one_clear_message(case):
    values, message = BAD[case]
    err = render_error(values)
    assert message in err, err
    assert "goroutine" not in err and len(err.splitlines()) < 10
