"""The chart with tenants (docs/tenants.md, "Redis users"; docs/deploy.md): the tenants file as a
ConfigMap the server and the workers read, Redis's ACL users of the deployment's own services
(server, worker, keda, exporter) rendered by an init container from their Secrets, tenants with
no Redis credentials at all, and values that cannot work refused in one message. One test runs
the rendered init container's script, the rendered redis.conf and the exporter's start script for
real: `decodebench tenants acl` with the Secrets' passwords, then redis-server, then each user.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml

from tests.support.acl import KEDA_SCRIPT
from tests.support.chart import VALUES_BY_NAME, env_of, find, password_file_secret, render, render_error, workers
from tests.support.repo import REPO
from tests.support.services import _wait_port, free_port
from worker.core import keys

TENANTS = VALUES_BY_NAME["tenants"]
SERVICE_SECRETS = {
    "server": "decodebench-server-redis",
    "worker": "decodebench-worker-redis",
    "keda": "decodebench-keda-redis",
    "exporter": "decodebench-exporter-redis",
}


def statefulset(docs) -> dict:
    (sts,) = find(docs, "StatefulSet")
    return sts["spec"]["template"]["spec"]


def server_pod(docs) -> dict:
    (dep,) = find(docs, "Deployment", "db-decodebench-server")
    return dep["spec"]["template"]["spec"]


def test_the_tenants_file_is_a_configmap_the_server_and_workers_read():
    docs = render(TENANTS)
    (cm,) = find(docs, "ConfigMap", "db-decodebench-tenants")
    rendered = yaml.safe_load(cm["data"]["tenants.yaml"])
    values = yaml.safe_load(TENANTS.read_text())["tenants"]
    assert rendered == values  # the same shape, as the values give it
    assert not any("redis_password_env" in t or "redis" in t.get("secrets", {}) for t in rendered["tenants"])
    for pod in (workers(docs)["gpu"]["spec"]["template"]["spec"], server_pod(docs)):
        c = pod["containers"][0]
        path = env_of(c)["DECODEBENCH_TENANTS_FILE"]["value"]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "tenants"]
        assert path == mount["mountPath"] + "/tenants.yaml"
        assert "subPath" not in mount  # the kubelet updates a directory mount in place: workers re-read it
        assert {"name": "tenants", "configMap": {"name": "db-decodebench-tenants"}} in pod["volumes"]
    # The server rolls on a new file; GPU workers follow it in place (worker.rq.reload), no roll.
    assert (
        "checksum/tenants"
        in find(docs, "Deployment", "db-decodebench-server")[0]["spec"]["template"]["metadata"]["annotations"]
    )
    gpu_pod = workers(docs)["gpu"]["spec"]["template"]["metadata"]
    assert not any(k.startswith("checksum/") for k in gpu_pod.get("annotations") or {})
    # keda only when a pool autoscales, exporter only with metrics: no user, no Secret needed.
    plain = render(TENANTS, {"redis": {"metrics": {"enabled": False}}, "worker": {"pools": [{"name": "gpu"}]}})
    (cm,) = find(plain, "ConfigMap", "db-decodebench-tenants")
    assert set(yaml.safe_load(cm["data"]["tenants.yaml"])) == {"tenants", "server", "worker"}
    # Without tenants there is no tenants file.
    assert not find(render(None), "ConfigMap", "db-decodebench-tenants")
    assert "DECODEBENCH_TENANTS_FILE" not in env_of(
        workers(render(None))["gpu"]["spec"]["template"]["spec"]["containers"][0]
    )


def test_each_service_logs_in_as_its_acl_user_and_the_controller_holds_no_redis_credentials():
    docs = render(TENANTS)
    for pod, user in ((workers(docs)["gpu"]["spec"]["template"]["spec"], "worker"), (server_pod(docs), "server")):
        env = env_of(pod["containers"][0])
        assert env["DECODEBENCH_REDIS_URL"]["value"] == f"redis://{user}@db-decodebench-redis.ml.svc:6379/0"
        assert password_file_secret(pod, pod["containers"][0]) == {
            "secretName": SERVICE_SECRETS[user],
            "key": "password",
        }
    (ctl,) = find(docs, "Deployment", "db-decodebench-controller")
    spec = ctl["spec"]["template"]["spec"]
    env = env_of(spec["containers"][0])
    assert not any(k.startswith("DECODEBENCH_REDIS") for k in env)
    assert env["DECODEBENCH_API_URL"]["value"] == "http://db-decodebench-server:8080"
    (token,) = [v for v in spec["volumes"] if v["name"] == "token"]
    assert token["secret"]["secretName"] == "decodebench-team-a-token"
    (auth,) = find(docs, "TriggerAuthentication")
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "decodebench-keda-redis", "key": "password"}
    ]
    (so,) = find(docs, "ScaledObject")
    assert {t["metadata"]["username"] for t in so["spec"]["triggers"]} == {"keda"}
    # Existing Secrets only: the tokens, the signing key and every password are the team's own.
    assert not find(docs, "Secret")


def test_redis_loads_the_acl_file_its_init_container_renders():
    docs = render(TENANTS)
    spec = statefulset(docs)
    (init,) = spec["initContainers"]
    assert init["command"][:2] == ["/bin/sh", "-c"] and "decodebench tenants acl" in init["args"][0]
    secret_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"] if "valueFrom" in e}
    assert secret_env == {
        f"{u.upper()}_REDIS_PASSWORD": {"name": secret, "key": "password"} for u, secret in SERVICE_SECRETS.items()
    }
    acl_volume = next(v for v in spec["volumes"] if v["name"] == "acl")
    assert "emptyDir" in acl_volume
    (conf,) = find(docs, "ConfigMap", "db-decodebench-redis")
    assert "aclfile /etc/redis-acl/users.acl" in conf["data"]["redis.conf"].splitlines()
    redis_c = spec["containers"][0]
    assert "requirepass" not in " ".join(redis_c["command"] + redis_c.get("args", []))
    assert "--user worker" in redis_c["readinessProbe"]["exec"]["command"][2]
    exporter = spec["containers"][1]
    assert env_of(exporter)["REDIS_USER"]["value"] == "exporter"
    assert "REDIS_PASSWORD" not in env_of(exporter)  # a file, not the environment
    (pw,) = [v for v in spec["volumes"] if v["name"] == "exporter-password"]
    assert pw["secret"]["secretName"] == "decodebench-exporter-redis"
    # A change of users, Secret names or the image's rules restarts Redis.
    (sts,) = find(docs, "StatefulSet")
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    other = find(render(TENANTS, {"redis": {"aclImage": {"tag": "2.0"}}}), "StatefulSet")[0]
    assert other["spec"]["template"]["metadata"]["annotations"]["checksum/acl"] != annotations["checksum/acl"]
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
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    for e in init["env"]:
        env[e["name"]] = passwords[e["valueFrom"]["secretKeyRef"]["name"]] if "valueFrom" in e else e["value"]
    proc = subprocess.run([*init["command"], script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not any(p in proc.stdout + proc.stderr for p in passwords.values())
    return tmp_path / "acl"


def _exporter_password_file(docs, tmp_path: Path, password: str) -> dict:
    """The exporter container's start script, run here up to its `exec`: the JSON password map."""
    exporter = statefulset(docs)["containers"][1]
    script = exporter["args"][0].split("exec /redis_exporter")[0]
    (tmp_path / "exporter-secret").mkdir()
    (tmp_path / "exporter-secret" / "password").write_text(password)
    env = {"PATH": os.environ["PATH"], **{e["name"]: e["value"] for e in exporter["env"] if "value" in e}}
    path = tmp_path / "redis-passwords.json"
    script = script.replace(env["REDIS_PASSWORD_FILE"], str(path))
    script = script.replace("/run/secrets/redis-exporter", str(tmp_path / "exporter-secret"))
    proc = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(path.read_text())


def _exporter_logs_in_with_its_password_file(docs, tmp_path: Path, port: int, password: str) -> None:
    """The exporter, with the password map its start script writes: metrics, and no key."""
    pw_map = _exporter_password_file(docs, tmp_path, password)
    assert set(pw_map.values()) == {password}
    assert "redis://exporter@127.0.0.1:6379" in pw_map and "redis://127.0.0.1:6379" in pw_map
    exporter = redis.Redis(port=port, username="exporter", password=pw_map["redis://exporter@127.0.0.1:6379"])
    assert exporter.info()["redis_version"] and "maxmemory" in exporter.config_get("maxmemory")
    exporter.slowlog_get(1)
    exporter.execute_command("LATENCY", "LATEST")
    with pytest.raises(redis.ResponseError, match="NOPERM|no permissions"):
        exporter.llen(keys.rq_queue_key(keys.queue_name("team-a")))


def _start_rendered_redis(docs, tmp_path: Path, acl_dir: Path) -> tuple[int, subprocess.Popen]:
    """redis-server with the rendered redis.conf (its aclfile moved to acl_dir), listening."""
    (conf,) = find(docs, "ConfigMap", "db-decodebench-redis")
    port = free_port()
    text = conf["data"]["redis.conf"].replace("port 6379", f"port {port}").replace("dir /data", f"dir {tmp_path}")
    text = text.replace("/etc/redis-acl", str(acl_dir))
    (tmp_path / "redis.conf").write_text(text + "bind 127.0.0.1\n")
    server = subprocess.Popen(["redis-server", str(tmp_path / "redis.conf")], stdout=subprocess.DEVNULL)
    _wait_port(port, server, "redis-server")
    return port, server


def test_the_rendered_acl_on_a_real_redis_server_keda_exporter_and_no_tenant(tmp_path):
    from controller.launch import submit as cq
    from controller.sweep.load import parse_spec
    from tests.support.queue import spec_dict
    from tests.support.services import SIGNING_KEY
    from worker import sweepstate
    from worker.store import FileStore

    docs = render(TENANTS)
    # A quote and a backslash in the exporter's password: its JSON file must still hold it exactly.
    passwords = {s: "canary-" + secrets.token_hex(12) for s in SERVICE_SECRETS.values()}
    passwords["decodebench-exporter-redis"] += '"\\x'
    acl_dir = _run_init_container(docs, tmp_path, passwords)
    users_acl = (acl_dir / "users.acl").read_text()
    assert not any(p in users_acl for p in passwords.values())  # hashes only
    port, server = _start_rendered_redis(docs, tmp_path, acl_dir)
    login = lambda user: redis.Redis(port=port, username=user, password=passwords[SERVICE_SECRETS[user]])
    try:
        srv = login("server")
        # The server submits, reads, cancels and retries a tenant's sweep.
        store = FileStore(tmp_path / "runs")
        sub = cq.submit(srv, store, parse_spec(spec_dict()), "team-a", key=SIGNING_KEY)
        assert sub.enqueued and sweepstate.read_status(srv, "team-a", sub.sweep_id).total("queued") == len(sub.enqueued)
        assert sweepstate.cancel_sweep(srv, "team-a", sub.sweep_id).cancelled == len(sub.enqueued)
        assert sorted(cq.retry(srv, store, "team-a", sub.sweep_id, key=SIGNING_KEY).enqueued) == sorted(sub.enqueued)
        # No tenant can log in: there is no such user, whatever the password.
        for tenant in ("team-a", "team-b", "research.x", "default"):
            for password in passwords.values():
                with pytest.raises(redis.AuthenticationError):
                    redis.Connection(port=port, username=tenant, password=password).connect()
        # KEDA, as the rendered triggers ask: its script on each listName counts, and cannot write.
        keda = login("keda")
        (so,) = find(docs, "ScaledObject")
        counts = {
            t["metadata"]["listName"]: keda.eval(KEDA_SCRIPT, 1, t["metadata"]["listName"])
            for t in so["spec"]["triggers"]
        }
        assert counts[keys.rq_queue_key(keys.queue_name("team-a"))] == len(sub.enqueued)
        assert sum(counts.values()) == len(sub.enqueued)
        with pytest.raises(redis.ResponseError):
            keda.eval("return redis.call('del', KEYS[1])", 1, keys.rq_queue_key(keys.queue_name("team-a")))
        assert srv.llen(keys.rq_queue_key(keys.queue_name("team-a"))) == len(sub.enqueued)
        _exporter_logs_in_with_its_password_file(docs, tmp_path, port, passwords["decodebench-exporter-redis"])
        worker = login("worker")
        assert worker.acl_whoami() == "worker"
        # The readiness probe, as rendered, passes with the worker's password file.
        (tmp_path / "pw").write_text(passwords["decodebench-worker-redis"])
        probe = statefulset(docs)["containers"][0]["readinessProbe"]["exec"]["command"]
        probe_cmd = probe[2].replace("/run/secrets/redis/password", str(tmp_path / "pw"))
        probe_cmd = probe_cmd.replace("-h 127.0.0.1", f"-h 127.0.0.1 -p {port}")
        assert subprocess.run([*probe[:2], probe_cmd], timeout=30).returncode == 0
    finally:
        server.terminate()
        server.wait(timeout=10)


_SERVICES = {
    "server": {"secret": "s"},
    "worker": {"secret": "w"},
}
_OK = {"tenant": "team-a", "server": {"tokens": {"existingSecret": "tok"}}, "controller": {"tokenSecret": "ctl"}}
BAD = {
    "tenant-redis-env": (
        {**_OK, "tenants": {"tenants": [{"name": "team-a", "redis_password_env": "A_PW"}], **_SERVICES}},
        "tenants.tenants[0].redis_password_env: tenants hold no Redis credentials (the submission server is their "
        "only door); remove it",
    ),
    "tenant-redis-secret": (
        {**_OK, "tenants": {"tenants": [{"name": "team-a", "secrets": {"redis": "a"}}], **_SERVICES}},
        "tenants.tenants[0].secrets.redis: tenants hold no Redis credentials",
    ),
    "no-server-secret": (
        {**_OK, "tenants": {"tenants": [{"name": "team-a"}]}},
        "set tenants.server.secret",
    ),
    "no-exporter-secret": (
        {**_OK, "tenants": {"tenants": [{"name": "team-a"}], **_SERVICES}, "redis": {"metrics": {"enabled": True}}},
        "set tenants.exporter.secret",
    ),
    "no-tokens": (
        {"controller": {"tokenSecret": "ctl"}, "tenants": {"tenants": [{"name": "team-a"}], **_SERVICES}},
        "server.tokens.existingSecret: with tenants, create a Secret with key tokens.yaml",
    ),
    "no-controller-token": (
        {"server": {"tokens": {"existingSecret": "tok"}}, "tenants": {"tenants": [{"name": "team-a"}], **_SERVICES}},
        "controller.tokenSecret: with tenants",
    ),
    "controller-tenant": (
        {**_OK, "tenant": "team-z", "tenants": {"tenants": [{"name": "team-a"}], **_SERVICES}},
        "`tenant` (team-z), which must be one of tenants.tenants (team-a)",
    ),
    "same-variable": (
        {
            **_OK,
            "tenants": {
                "tenants": [{"name": "team-a"}],
                "server": {"secret": "s", "redis_password_env": "WORKER_REDIS_PASSWORD"},
                "worker": {"secret": "w"},
            },
        },
        "tenants.worker.redis_password_env: WORKER_REDIS_PASSWORD is already the variable of server",
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
