"""A model that cannot load fails once in distributed mode too (issue 28 item 1): real redis-server,
moto's S3, two `decodebench-worker --burst` processes. The first job of the unloadable model loads
it once and marks it unavailable in the sweep; its other jobs fail for good with that one reason,
without a load attempt, and the good model's jobs complete. `status` and `failures` show the
reason once, with a count."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from click.testing import CliRunner

from tests.support.services import s3_env
from tests.support.workerprocs import BIN, env_for, start_workers, wait_all
from worker.core import keys

pytestmark = pytest.mark.slow


def _events(logs, name: str) -> list[dict]:
    out = []
    for path in logs.glob("w*.log"):
        for line in path.read_text().splitlines():
            if line.startswith("{") and f'"{name}"' in line:
                event = json.loads(line)
                if event.get("event") == name:
                    out.append(event)
    return out


def test_an_unloadable_model_is_tried_once_and_its_jobs_fail_with_one_reason(
    redis_url, s3_endpoint, s3_bucket, tiny_model, prompts_file, tmp_path, signing_key_file
):
    import redis

    from controller.cli import main as cli
    from worker.sweepstate import read_status

    bad = tmp_path / "no-weights"  # config and tokenizer, no weights: resolves, cannot load
    shutil.copytree(tiny_model, bad, ignore=shutil.ignore_patterns("*.safetensors"))
    spec = {
        "name": "unavailable",
        "models": [{"path": str(bad), "name": "broken"}, {"path": tiny_model, "name": "tiny"}],
        "prompts": {"path": prompts_file, "limit": 4, "shard_size": 1},
        "strategies": [{"name": "greedy"}],
        "generation": {"max_new_tokens": 4, "batch_size": 1, "seeds": [0], "warmup": False},
        "metrics": ["mean_length"],
    }
    (tmp_path / "sweep.json").write_text(json.dumps(spec))
    env = {**env_for(redis_url, tmp_path, signing_key_file), **s3_env(s3_endpoint)}
    env["DECODEBENCH_STORE"] = f"s3://{s3_bucket}/runs"
    r = subprocess.run([str(BIN / "decodebench"), "submit", str(tmp_path / "sweep.json")], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    sweep_id = r.stdout.split()[1]
    wait_all(start_workers(2, env, tmp_path), tmp_path)

    conn = redis.Redis.from_url(redis_url)
    s = read_status(conn, "default", sweep_id)
    assert s.total("done") == 4 and s.total("failed") == 4 and s.complete
    assert all(cell.startswith("tiny::") for cell, counts in s.cells.items() if counts.get("done"))
    reasons = {reason for _, _, reason in s.failures}
    assert len(reasons) == 1 and "no weights file" in reasons.pop()
    assert [(m, n) for m, _, n in s.unavailable] == [(str(bad), 4)]
    # one load attempt for the broken model: one worker probed it, the three others failed without one
    assert [e["model"] for e in _events(tmp_path, "model.first_load") if e["model"] == str(bad)] == [str(bad)]
    assert len(_events(tmp_path, "model.unavailable")) == 1
    assert len(_events(tmp_path, "job.model_unavailable")) == 3
    # an expected refusal is one line in the workers' logs (issue 42), never RQ's traceback of it
    refused = _events(tmp_path, "job.refused")
    assert len(refused) == 4 and all("no weights file" in e["reason"] for e in refused)
    assert not [p.name for p in tmp_path.glob("w*.log") if "Traceback" in p.read_text()]
    for job_id in conn.hkeys(keys.sweep("default", sweep_id, "failures")):  # failed for good, never retried
        rq_job = conn.hgetall(keys.rq_job_key("default", job_id.decode()))
        assert rq_job[b"status"] == b"failed" and rq_job.get(b"retries_left", b"0") == b"0"

    for command in ("status", "failures"):
        out = CliRunner().invoke(cli, [command, sweep_id, "--redis-url", redis_url]).output
        assert out.count("no weights file") == 1, out  # the reason once
        assert f"model {bad} cannot load, 4 jobs failed: " in out, out


def test_a_first_load_held_by_a_dead_worker_is_taken_over(redis_url):
    """A worker killed while it loads a model first must not keep the sweep's other workers waiting:
    on its own host its death is seen at once (a gone or zombie process), elsewhere the probe expires."""
    import os
    import signal
    import socket

    import redis

    from worker.rq.unavailable import _died_here
    from worker.sweepstate import gate_models

    conn = redis.Redis.from_url(redis_url)
    conn.hset(keys.sweep("default", "s1", "meta"), "epoch", "7")
    here = socket.gethostname()
    assert gate_models(conn, "default", "s1", ["m"], f"{here}:1")[0] == "probe"
    assert gate_models(conn, "default", "s1", ["m"], "other:2") == ("wait", "m", f"{here}:1")
    assert gate_models(conn, "default", "s1", ["m"], "other:2", dead=f"{here}:1")[0] == "probe"

    child = subprocess.Popen(["sleep", "30"])
    try:
        assert not _died_here(f"{here}:{child.pid}") and not _died_here(f"{here}:{os.getpid()}")
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not _died_here(f"{here}:{child.pid}"):  # a zombie until reaped
            assert time.monotonic() < deadline
    finally:
        child.wait()
    assert _died_here(f"{here}:{child.pid}")  # reaped: gone
    assert not _died_here(f"elsewhere:{child.pid}")  # another host's process: its probe's deadline decides
