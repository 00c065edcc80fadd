"""The submission server as the tests run it: a real `decodebench serve` on a loopback port,
with a tenants file, a tokens file (random tokens, their hashes on disk) and the session's
signing key; and the two-tenant deployment most server tests use."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.repo import REPO
from tests.support.services import free_port

BIN = Path(sys.executable).parent


def token(who: str) -> str:
    return f"dbt_{who}_{secrets.token_urlsafe(24)}"


@dataclass
class Deployment:
    """A running server: its URL, the tokens by name, its files and its log."""

    url: str
    tokens: dict[str, str]
    dir: Path
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    extra: dict = field(default_factory=dict)

    def client(self, who: str, **kwargs) -> httpx.Client:
        """A tenant's client; 60 s a request, not httpx's 5 s: the server's first report call imports the report's
        code, which took over 5 s on the 2-core machine at load 8 (a test failed on the timeout, not the server)."""
        kwargs.setdefault("timeout", 60)
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[who]}"}, **kwargs)

    def write_tokens(self, entries: dict[str, dict]) -> None:
        """`entries`: name -> {tenant or admin}; each gets a fresh token unless it has one."""
        lines = ["tokens:"]
        for name, entry in entries.items():
            tok = self.tokens.setdefault(name, token(name))
            role = "admin: true" if entry.get("admin") else f"tenant: {entry['tenant']}"
            lines.append(f"  - {{id: {name}, {role}, sha256: {hashlib.sha256(tok.encode()).hexdigest()}}}")
        path = self.dir / "tokens.yaml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(path)  # as a Secret volume updates: an atomic swap

    def start(self) -> None:
        port = free_port()
        tls = bool(self.env.get("DECODEBENCH_TLS_CERT_FILE"))  # the test's CA: extra["ca"]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        verify = ssl.create_default_context(cafile=self.extra["ca"]) if tls else True
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [str(BIN / "decodebench"), "serve", "--port", str(port)], env=self.env, stdout=out, stderr=out
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"decodebench serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/healthz", timeout=1, verify=verify).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"decodebench serve did not answer within 60 s:\n{self.log.read_text()}")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill() if kill else self.proc.terminate()
        self.proc.wait(timeout=30)


TENANTS = """
tenants:
  - name: team-a
    models: [{model}]
    quota: {{queued_jobs: 400, queued_mb: 64, sweeps_in_flight: 5, queued_report_cells: 3}}
    rate_limit: 100000
  - name: team-b
    rate_limit: 100000
"""
TOKENS = {"alice": {"tenant": "team-a"}, "bob": {"tenant": "team-b"}, "ops": {"admin": True}}


def server_env(tmp: Path, redis_url: str, store: str, signing_key_file: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEBENCH_")}
    env.update(
        PYTHONPATH=str(REPO),
        DECODEBENCH_REDIS_URL=redis_url,
        DECODEBENCH_STORE=store,
        DECODEBENCH_TOKENS_FILE=str(tmp / "tokens.yaml"),
        DECODEBENCH_TENANTS_FILE=str(tmp / "tenants.yaml"),
        DECODEBENCH_SIGNING_KEY_FILE=signing_key_file,
        DECODEBENCH_LOG_FORMAT="json",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env


@contextlib.contextmanager
def deployment(
    tmp: Path, redis_url: str, signing_key_file: str, model: str, tenants: str = TENANTS, ca: str = "", **extra: str
) -> Iterator[Deployment]:
    """Two tenants (team-a: only `model`, a small quota; team-b: anything), an admin, a running server
    (over TLS with DECODEBENCH_TLS_CERT_FILE/_KEY_FILE in `extra`, verified with the CA bundle `ca`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tenants.yaml").write_text(tenants.format(model=model))
    store = str(tmp / "runs")
    env = server_env(tmp, redis_url, store, signing_key_file, **extra)
    dep = Deployment(url="", tokens={}, dir=tmp, log=tmp / "server.log", env=env, extra={"ca": ca})
    dep.write_tokens(TOKENS)
    dep.extra["store"] = store
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()
