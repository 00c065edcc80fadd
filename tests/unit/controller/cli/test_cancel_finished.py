"""Cancelling a sweep with nothing left to stop (every job done, or failed: the user's cancel crossed its
last job) left it `[CANCELLED]` for good: `retry --failed` with nothing to enqueue kept the mark, and a
plain `submit` of the spec was ignored ("a cancelled sweep resumes only on purpose")."""

from __future__ import annotations

import json

from click.testing import CliRunner

from controller.cli import main as cli
from controller.sweep.load import load_spec
from controller.sweep.plan import plan
from tests.support.queue import spec_dict
from worker import sweepstate
from worker.core import keys
from worker.core.contract import JobStatus
from worker.sweepstate import transition


def test_cancel_of_a_sweep_with_nothing_queued_or_running_leaves_it_as_it_ended(redis_url, tmp_path, monkeypatch):
    import redis

    monkeypatch.setenv("DECODEBENCH_REDIS_URL", redis_url)
    monkeypatch.setenv("DECODEBENCH_STORE", str(tmp_path / "runs"))
    conn = redis.Redis.from_url(redis_url)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")  # a local model directory
    spec = tmp_path / "sweep.json"
    spec.write_text(json.dumps(spec_dict(model=str(tmp_path / "m"))))
    runner = CliRunner()
    r = runner.invoke(cli, ["submit", str(spec)])
    assert r.exit_code == 0, r.output
    sweep_id = r.output.split()[1]
    for j in plan(load_spec(str(spec)), "default"):  # every job ran, as a worker records it
        transition(conn, "default", sweep_id, j.job_id, j.cell, JobStatus.RUNNING)
        transition(conn, "default", sweep_id, j.job_id, j.cell, JobStatus.DONE)
    conn.delete(keys.rq_queue_key(keys.queue_name("default")))

    r = runner.invoke(cli, ["cancel", sweep_id])
    assert r.exit_code == 0, r.output
    assert f"sweep {sweep_id}: nothing queued or running, nothing to cancel" in r.output
    assert not sweepstate.is_cancelled(conn, "default", sweep_id)
    r = runner.invoke(cli, ["status", sweep_id])
    assert r.exit_code == 0 and "[CANCELLED]" not in r.output and "complete" in r.output, r.output
