"""GitOps and the generated Redis password, with the real helm and a real redis-server.

Without redis.auth.existingSecret the chart generates the password: `helm upgrade` keeps it
(lookup), but `helm template`, Argo CD and --dry-run cannot look it up and render a new one each
time. Redis reads `requirepass` at start only while the workers' password file follows the
Secret, so the StatefulSet carries a checksum of the generated password: a new one restarts Redis.
The Secret is kept on uninstall (helm.sh/resource-policy: keep). existingSecret, the documented
GitOps path, renders no Secret and no password checksum: two renders are the same.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import time

import pytest
import redis

from tests.support.chart import find, render
from tests.support.services import free_port
from worker.core.errors import ServiceError
from worker.core.redisconn import connect

SECRET = "db-decodebench-redis"


def generated(docs: list[dict]) -> tuple[str, str]:
    """(the password in the generated Secret, the StatefulSet's checksum/password)."""
    (secret,) = find(docs, "Secret", SECRET)
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # survives uninstall
    (sts,) = find(docs, "StatefulSet")
    b64 = secret["data"]["redis-password"]
    checksum = sts["spec"]["template"]["metadata"]["annotations"]["checksum/password"]
    assert checksum == hashlib.sha256(f"decodebench-redis:{b64}".encode()).hexdigest()  # this render's password
    return base64.b64decode(b64).decode(), checksum


def test_helm_template_twice_renders_two_passwords_and_two_checksums():
    first, second = render({}), render({})
    (pw1, sum1), (pw2, sum2) = generated(first), generated(second)
    assert pw1 != pw2 and sum1 != sum2  # the caveat: every render of a GitOps tool is a new password
    # ... and Redis's pod template changes with it, so Redis restarts with the password the workers read.


def test_an_existing_secret_renders_no_secret_and_the_same_redis_twice():
    values = {"redis": {"auth": {"existingSecret": "redis-auth", "passwordKey": "password"}}}
    first, second = render(values), render(values)
    assert not find(first, "Secret", SECRET)
    (sts1,), (sts2,) = find(first, "StatefulSet"), find(second, "StatefulSet")
    assert "checksum/password" not in sts1["spec"]["template"]["metadata"]["annotations"]
    assert sts1 == sts2
    (volume,) = [v for v in sts1["spec"]["template"]["spec"]["volumes"] if v["name"] == "password"]
    assert volume["secret"]["secretName"] == "redis-auth"


def redis_container_script(docs: list[dict], tmp_path, password: str, port: int) -> subprocess.Popen:
    """The Redis container's own start script, its paths moved to tmp_path, with this render's files."""
    (sts,) = find(docs, "StatefulSet")
    (cm,) = find(docs, "ConfigMap", "db-decodebench-redis")
    (container,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "redis"]
    conf = cm["data"]["redis.conf"].replace("port 6379", f"port {port}").replace("dir /data", f"dir {tmp_path}")
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "etc" / "redis.conf").write_text(conf + "bind 127.0.0.1\n")
    (tmp_path / "password").write_text(password)
    script = (
        container["args"][0]
        .replace("/etc/redis/redis.conf", str(tmp_path / "etc" / "redis.conf"))
        .replace("/run/secrets/redis/password", str(tmp_path / "password"))
        .replace("/tmp/redis.conf", str(tmp_path / "redis.conf"))
    )
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            redis.Redis(port=port, password=password).ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.terminate()
    raise AssertionError("redis-server did not start")


def test_redis_keeps_its_password_until_it_restarts_and_then_takes_the_new_one(tmp_path, monkeypatch):
    """What the checksum is for: the kubelet updates the workers' password file, Redis does not re-read."""
    first, second = render({}), render({})
    (pw1, _), (pw2, _) = generated(first), generated(second)
    port = free_port()
    worker_file = tmp_path / "worker-password"
    monkeypatch.setenv("DECODEBENCH_REDIS_PASSWORD_FILE", str(worker_file))
    url = f"redis://127.0.0.1:{port}/0"
    (tmp_path / "a").mkdir()
    proc = redis_container_script(first, tmp_path / "a", pw1, port)
    try:
        worker_file.write_text(pw1)
        assert connect(url).ping()
        worker_file.write_text(pw2)  # the second render's Secret reached the workers' volume
        with pytest.raises(ServiceError):
            connect(url)  # ... but the running Redis still holds the first password
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    (tmp_path / "b").mkdir()
    proc = redis_container_script(second, tmp_path / "b", pw2, port)  # the changed checksum: a new Redis pod
    try:
        assert connect(url).ping()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
