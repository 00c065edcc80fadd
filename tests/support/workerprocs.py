"""`decodebench-worker` processes as a pool runs them (`--device cpu --burst`, one torch thread each), on the
test's redis-server and file store, with their logs: for the distributed end-to-end and hostile tests; and one
long-lived worker's environment and log lines (`worker_env`, `wait_for_line`) for the worker's own life tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
GRACE_S = 10  # worker_env's stop grace; an idle worker must be gone well before


def env_for(redis_url: str, store: Path, signing_key_file: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEBENCH_")}
    env.update(
        DECODEBENCH_REDIS_URL=redis_url,
        DECODEBENCH_STORE=str(store),
        DECODEBENCH_SIGNING_KEY_FILE=signing_key_file,  # the session's (conftest)
        DECODEBENCH_HEARTBEAT_TTL="5",
        DECODEBENCH_REAPER_INTERVAL="0.5",
        DECODEBENCH_LOG_FORMAT="json",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def start_workers(n: int, env: dict[str, str], logs: Path, prefix: str = "w") -> dict[str, subprocess.Popen]:
    procs = {}
    for i in range(n):
        name = f"{prefix}{i}-{os.getpid()}"
        out = (logs / f"{name}.log").open("w")
        procs[name] = subprocess.Popen(
            [str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", "default", "--burst", "--name", name],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return procs


def wait_all(procs: dict[str, subprocess.Popen], logs: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    try:
        for name, proc in procs.items():
            code = proc.wait(max(1, deadline - time.monotonic()))
            assert code in (0, -signal.SIGKILL), f"{name} exited {code}:\n{(logs / f'{name}.log').read_text()[-3000:]}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()


def wait_for_line(log: Path, event: str, proc: subprocess.Popen, timeout: float = 120) -> dict:
    """The first JSON line of a worker's log whose event starts with `event` (the worker still running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event", "").startswith(event):
                return json.loads(line)
        assert proc.poll() is None, f"worker exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {event} line within {timeout}s:\n{log.read_text()[-3000:]}")


def worker_env(redis_url: str, tmp_path: Path, signing_key_file: str) -> dict:
    """A long-lived worker's environment: a reaper interval of 60 s (a blocking pop that long), a grace of GRACE_S."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEBENCH_")}
    env.update(
        DECODEBENCH_REDIS_URL=redis_url,
        DECODEBENCH_STORE=str(tmp_path / "store"),
        DECODEBENCH_SIGNING_KEY_FILE=signing_key_file,
        DECODEBENCH_LOG_FORMAT="json",
        DECODEBENCH_REAPER_INTERVAL="60",
        DECODEBENCH_STOP_GRACE=str(GRACE_S),
        CUDA_VISIBLE_DEVICES="",
    )
    return env
