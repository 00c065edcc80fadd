"""`decodebench-worker` processes as a pool runs them (`--device cpu --burst`, one torch thread each), on the
test's redis-server and file store, with their logs: for the distributed end-to-end and hostile tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


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
