"""A job whose worker is SIGKILLed, in a sweep cancelled before the job is found lost: the reaper cancels it
(as cancel cancels a queued job) and no worker starts it again. Real `decodebench-worker` processes on a real
redis-server; and a worker that is handed such a job anyway (RQ's own cleanup may requeue it) does not start it."""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis

from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from tests.support.queue import rq_queue, spec_dict
from tests.support.services import SIGNING_KEY as KEY
from tests.support.worker import run_worker
from tests.support.workerprocs import env_for, start_workers, wait_all
from worker import sweepstate
from worker.core import keys
from worker.core.contract import JobStatus
from worker.store import FileStore

pytestmark = pytest.mark.slow


def first_running_job(conn, sweep_id: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job_id, state in conn.hgetall(keys.sweep("default", sweep_id, "state")).items():
            if state == JobStatus.RUNNING.value.encode():
                return job_id.decode()
        time.sleep(0.02)
    raise AssertionError("no job started")


def lost_job(redis_url, tmp_path, tiny_model, signing_key_file):
    """A sweep of tenant `default` whose first running job's worker was SIGKILLed mid-job (its heartbeat stops):
    (the client, the submit's outcome, that job's id, the workers' environment)."""
    conn = redis.Redis.from_url(redis_url)
    store = FileStore(tmp_path / "runs")
    out = cq.submit(conn, store, parse_spec(spec_dict(tiny_model, seeds=(1,))), "default", key=KEY)
    env = env_for(redis_url, tmp_path / "runs", signing_key_file)  # heartbeat TTL 5 s, reaper every 0.5 s
    victim = start_workers(1, env, tmp_path)
    try:
        job_id = first_running_job(conn, out.sweep_id)
        next(iter(victim.values())).send_signal(signal.SIGKILL)
    finally:
        wait_all(victim, tmp_path)
    return conn, out, job_id, env


def test_a_job_lost_with_its_worker_in_a_cancelled_sweep_is_cancelled_not_run_again(
    redis_url, tmp_path, tiny_model, signing_key_file
):
    conn, out, job_id, env = lost_job(redis_url, tmp_path, tiny_model, signing_key_file)
    sweepstate.cancel_sweep(conn, "default", out.sweep_id)  # the stop it sends reaches no one
    assert conn.hget(keys.sweep("default", out.sweep_id, "state"), job_id) == b"running"
    reaper = start_workers(1, env, tmp_path, prefix="reaper")  # burst: it stays until the lost job is settled
    wait_all(reaper, tmp_path)
    log = (tmp_path / f"{next(iter(reaper))}.log").read_text()
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert any(e["event"] == "job.lost" and e["job_id"] == job_id for e in events), log[-2000:]
    assert not any(e["event"] in ("worker.requeued_lost_jobs", "job.start") for e in events), log[-2000:]
    status = sweepstate.read_status(conn, "default", out.sweep_id)
    assert status.total("running") == status.total("done") == 0 and status.total("cancelled") == out.jobs
    # in RQ's books as a queued job of a cancelled sweep is: canceled, its payload dropped, in no queue
    assert conn.hget(keys.rq_job_key("default", job_id), "status") == b"canceled"
    assert not conn.hexists(keys.rq_job_key("default", job_id), "data")
    assert rq_queue(conn).count == 0 and not conn.zcard(keys.running("default"))


def test_a_worker_handed_a_job_of_a_cancelled_sweep_does_not_start_it(conn, store, tiny_model, monkeypatch):
    started = []  # a job starts by loading its model (before_job), then runs (run_job)
    monkeypatch.setattr("worker.rq.unavailable.before_job", lambda conn, spec, runtime: started.append(spec.job_id))
    monkeypatch.setattr("worker.engine.job.run_job", lambda spec, **kw: started.append(spec.job_id) or {})
    out = cq.submit(conn, store, parse_spec(spec_dict(tiny_model, seeds=(1,))), "default", key=KEY)
    job = rq_queue(conn).get_jobs()[0]
    spec = job.args[0]
    # its sweep records it running (a worker took it, then died) while RQ's own cleanup put it back in the queue
    sweepstate.transition(conn, "default", out.sweep_id, job.id, spec["cell"], JobStatus.RUNNING)
    sweepstate.cancel_sweep(conn, "default", out.sweep_id)
    assert rq_queue(conn).get_job_ids() == [job.id]
    run_worker(conn)
    assert started == []
    assert conn.hget(keys.sweep("default", out.sweep_id, "state"), job.id) == JobStatus.CANCELLED.value.encode()


def test_a_job_lost_with_its_worker_is_requeued_by_a_worker_of_another_tenant(
    redis_url, tmp_path, tiny_model, signing_key_file
):
    """Workers reaped only the tenants they serve: a lost job of a tenant whose own pool was gone (scaled to zero,
    its one pod killed) stayed `running` for ever, in no queue, so nothing scaled the pool up again. Now any worker
    requeues it, into its own tenant's queue."""
    import subprocess

    from tests.support.workerprocs import BIN

    conn, out, job_id, env = lost_job(redis_url, tmp_path, tiny_model, signing_key_file)
    log = (tmp_path / "other.log").open("w")
    other = subprocess.Popen([str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", "team-b", "--name",
                              f"other-{job_id}"], env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while conn.hget(keys.sweep("default", out.sweep_id, "state"), job_id) == b"running":
            assert time.monotonic() < deadline, (tmp_path / "other.log").read_text()[-2000:]
            time.sleep(0.2)
    finally:
        other.terminate()
        other.wait(30)
    assert conn.hget(keys.sweep("default", out.sweep_id, "state"), job_id) == b"queued"
    assert job_id in rq_queue(conn).job_ids  # the front of its own tenant's queue
