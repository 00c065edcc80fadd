"""Real services on loopback for the tests: redis-server and moto's S3 server.

Each starts on a free port as a subprocess and stops at the end of the session.
`scripts/setup-test-deps.sh` installs redis-server (Debian) and moto (PyPI).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.repo import REPO

# The job signing key of the test session (DECODEBENCH_SIGNING_KEY_FILE points at a file holding it).
SIGNING_KEY = b"decodebench-test-signing-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


@contextlib.contextmanager
def redis_server(
    appendonly: bool = False, data_dir: str | None = None, port: int | None = None, aclfile: str | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A redis-server on a free loopback port (with `aclfile`: its users); yields (url, process)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run scripts/setup-test-deps.sh (make test does)")
    port = port or free_port()
    tmp = data_dir or tempfile.mkdtemp(prefix="decodebench-redis-")
    args = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        tmp,
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        "--protected-mode",
        "yes",
        *(["--aclfile", aclfile] if aclfile else []),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc, "redis-server")
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server mode on a free loopback port; yields the endpoint URL."""
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    cmd = [str(moto)] if moto.exists() else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(
        [*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _wait_port(port, proc, "moto_server")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def s3_env(endpoint: str) -> dict[str, str]:
    """Environment that points boto3 at the loopback endpoint with dummy credentials."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DECODEBENCH_S3_ENDPOINT_URL": endpoint,
    }


# Short Austen-like openings for the engine tests (prompts of different lengths, so left padding matters).
AUSTEN_PROMPTS = [
    "It was a truth universally acknowledged that",
    "She had never seen",
    "The morning was fine, and",
    "Mr. Elliot",
    "I do not know what you mean by",
    "Her sister was",
    "They walked together towards the",
    "Anne",
    "He had been",
]

TINY_MODEL = REPO / "examples" / "models" / "austen-tiny"
SMALL_MODEL = REPO / "examples" / "models" / "austen-small"
PROMPTS = REPO / "examples" / "prompts" / "austen-heldout.jsonl"
ENV_NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
