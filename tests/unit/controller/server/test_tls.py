"""TLS at the two doors, with real certificates on loopback (tests/support/tls.py): `decodebench
serve` serving HTTPS itself from a certificate and key file, the CLI verifying the server's
certificate (DECODEBENCH_CA_BUNDLE for a private CA; no switch turns verification off), and a
rediss:// Redis (a real redis-server with TLS) verified with DECODEBENCH_REDIS_CA_FILE."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import redis

from controller.server.client import ApiClient
from tests.support.server import BIN, deployment, server_env
from tests.support.services import _wait_port, free_port
from tests.support.tls import make_certs
from worker.core.errors import ServiceError, UsageError
from worker.core.redisconn import connect


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture()
def tls_dep(tmp_path, redis_url, signing_key_file, tiny_model, certs):
    extra = {"DECODEBENCH_TLS_CERT_FILE": str(certs.cert), "DECODEBENCH_TLS_KEY_FILE": str(certs.key)}
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, ca=str(certs.ca), **extra) as dep:
        yield dep


def doctor(dep, who: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in dep.env.items() if not k.startswith("DECODEBENCH_")}
    env = base | {"DECODEBENCH_TOKEN": dep.tokens[who], "DECODEBENCH_API_RETRIES": "1",
                  "DECODEBENCH_STORE": dep.extra["store"]} | env  # fmt: skip
    cmd = [str(BIN / "decodebench"), "doctor", "--api", dep.url]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_the_server_serves_https_and_the_cli_verifies_it_with_the_ca_bundle(tls_dep, certs, monkeypatch):
    assert tls_dep.url.startswith("https://127.0.0.1:")
    monkeypatch.setenv("DECODEBENCH_CA_BUNDLE", str(certs.ca))
    with ApiClient(tls_dep.url, tls_dep.tokens["alice"], retries=0) as client:
        assert client.call("GET", "/v1/whoami")["tenant"] == "team-a"
    proc = doctor(tls_dep, "alice", DECODEBENCH_CA_BUNDLE=str(certs.ca))
    assert "PASS  server" in proc.stdout and "token alice acts for tenant team-a" in proc.stdout, proc.stdout


def test_a_certificate_the_cli_cannot_verify_is_one_line_without_retries(tls_dep, certs, monkeypatch):
    for ca in (None, certs.other_ca):  # the system's CAs; a CA that signed something else
        if ca is None:
            monkeypatch.delenv("DECODEBENCH_CA_BUNDLE", raising=False)
        else:
            monkeypatch.setenv("DECODEBENCH_CA_BUNDLE", str(ca))
        refused = pytest.raises(UsageError, match="certificate did not verify .*set DECODEBENCH_CA_BUNDLE")
        with ApiClient(tls_dep.url, tls_dep.tokens["alice"], retries=5) as client, refused:
            client.call("GET", "/v1/whoami")
    proc = doctor(tls_dep, "alice")
    assert "FAIL" in proc.stdout and "DECODEBENCH_CA_BUNDLE" in proc.stdout and "Traceback" not in proc.stderr


def test_a_bad_ca_bundle_or_tls_pair_is_one_line(tmp_path, certs, monkeypatch, redis_url, signing_key_file):
    monkeypatch.setenv("DECODEBENCH_CA_BUNDLE", str(tmp_path / "missing.pem"))
    with pytest.raises(UsageError, match="DECODEBENCH_CA_BUNDLE=.*missing.pem: cannot read it"):
        ApiClient("https://127.0.0.1:1", "dbt_x")
    (tmp_path / "tokens.yaml").write_text("tokens: []\n")
    (tmp_path / "tenants.yaml").write_text("tenants:\n  - name: team-a\n")
    env = server_env(tmp_path, redis_url, str(tmp_path / "runs"), signing_key_file)
    for cert, key, message in [
        (certs.cert, None, "--tls-cert-file and --tls-key-file go together"),
        (certs.ca, certs.key, "cannot load them"),  # the key is not the CA certificate's
    ]:
        tls = {"DECODEBENCH_TLS_CERT_FILE": str(cert)} | ({"DECODEBENCH_TLS_KEY_FILE": str(key)} if key else {})
        proc = subprocess.run([str(BIN / "decodebench"), "serve", "--port", str(free_port())], env=env | tls,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


@pytest.fixture()
def tls_redis(tmp_path, certs):
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key), "--tls-ca-cert-file", str(certs.ca),
         "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_port(port, proc, "redis-server --tls-port")
        yield f"rediss://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


def test_rediss_is_verified_against_the_redis_ca_file(tls_redis, certs, monkeypatch):
    monkeypatch.setenv("DECODEBENCH_REDIS_CA_FILE", str(certs.ca))
    conn = connect(tls_redis)
    assert conn.ping() and conn.set("k", "v") and conn.get("k") == b"v"
    conn.close()
    monkeypatch.setenv("DECODEBENCH_REDIS_CA_FILE", str(certs.other_ca))
    with pytest.raises(ServiceError, match="certificate verify failed"):
        connect(tls_redis)
    monkeypatch.delenv("DECODEBENCH_REDIS_CA_FILE")
    with pytest.raises(ServiceError, match="certificate verify failed"):
        connect(tls_redis)  # the system's CAs do not know the private one
    with pytest.raises((redis.ConnectionError, ServiceError)):
        connect(tls_redis.replace("rediss://", "redis://"))  # no plain text on a TLS port
