"""The report's distributed map on loopback: `decodebench report-worker` processes, the operator's direct
backend, and a report job hash as a client with Redis access could plant it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

from worker.core import keys, signing

BIN = Path(sys.executable).parent  # the console scripts of this environment


@contextlib.contextmanager
def report_workers(n: int, redis_url: str, store_url: str, env: dict[str, str] | None = None):
    """`n` report-worker processes, as a pool would run them (with `env` added to this process's environment);
    stopped with SIGTERM at the end."""
    env = {**os.environ, "DECODEBENCH_REDIS_URL": redis_url, "DECODEBENCH_STORE": store_url, **(env or {})}
    procs = [
        subprocess.Popen([str(BIN / "decodebench"), "report-worker", "*"], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)


def operator(redis_url: str, store_url: str, tenant: str = "default"):
    from controller.cli.backend import Direct

    return Direct(redis_url, store_url, tenant)


def plant(conn, tenant: str, job_id: str, call: list, key: bytes | None, queue: str | None = None) -> None:
    """A job hash as a client with Redis access could write it, pushed onto a report queue."""
    stored = zlib.compress(json.dumps(call).encode())
    sig = {signing.SIG_FIELD: signing.sign(key, tenant, job_id, stored)} if key else {}
    conn.hset(keys.rq_job_key(tenant, job_id), mapping={"data": stored, "status": "queued", **sig})
    conn.rpush(keys.rq_queue_key(queue or keys.report_queue(tenant)), job_id)
