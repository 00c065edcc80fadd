"""The RQ worker in-process against a real redis-server, with the tiny bundled model on CPU.

Heartbeat TTL and reaper interval are shortened so that failure detection is quick.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import pytest
from click.testing import CliRunner

from controller.cli import main as cli
from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from tests.support.queue import rq_queue, spec_dict
from tests.support.services import SIGNING_KEY as KEY
from tests.support.worker import conn_url, cpu_runtime, make_worker, run_worker, submit, wait_for
from worker import sweepstate
from worker.core import keys

pytestmark = pytest.mark.usefixtures("restore_signals")  # tests/conftest.py: the worker installs its handlers


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setenv("DECODEBENCH_RETRY_INTERVALS", "1,1,1")


def running_job(conn, sweep_id: str):
    states = conn.hgetall(keys.sweep("default", sweep_id, "state"))
    return next((j.decode() for j, s in states.items() if s == b"running"), None)


def test_prepare_cuda_env_pins_numbering_and_honours_uuids():
    from worker.cli import prepare_cuda_env

    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-1f2e,GPU-3a4b"}
    notes = prepare_cuda_env(env)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == "GPU-1f2e,GPU-3a4b" and notes
    env = {"NVIDIA_VISIBLE_DEVICES": "2,3"}  # indices: the container runtime renumbers them from 0
    prepare_cuda_env(env)
    assert "CUDA_VISIBLE_DEVICES" not in env
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-1f2e", "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    prepare_cuda_env(env)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


@pytest.fixture()
def _reset_structlog():
    """`main()` points structlog at the captured stderr of the test: undo it afterwards."""
    import structlog

    yield
    structlog.reset_defaults()


def test_worker_refuses_a_device_that_does_not_exist(capsys, monkeypatch, _reset_structlog):
    from worker.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cuda:1", "--queues", "default"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device cuda:1:") and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "gpu0"])
    assert exit_info.value.code == 2


def test_worker_runs_jobs_in_process_and_keeps_the_model_cached(conn, store, tiny_model):
    out = submit(conn, store, tiny_model)
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.complete and s.total("done") == 9 and s.new_tokens > 0
    assert store.complete_job_ids("default", out.sweep_id) == set(out.enqueued)
    result = store.load_result("default", out.sweep_id, out.enqueued[0])
    assert result.provenance["device"]["device"] == "cpu" and "uuid" in result.provenance["device"]
    assert max(e.uses for e in cpu_runtime().cache.entries()) >= 8  # loaded once, reused
    assert conn.zcard(keys.running("default")) == 0


def test_bad_model_fails_at_once_with_a_readable_reason_and_retry_after_fixing_it(conn, store, tiny_model, tmp_path):
    from rq.registry import FailedJobRegistry

    missing = tmp_path / "gone"
    missing.mkdir()
    spec = spec_dict(models=[{"path": tiny_model, "name": "good"}, {"path": str(missing), "name": "bad"}])
    out = cq.submit(conn, store, parse_spec(spec), "default", key=KEY)
    missing.rmdir()  # the workers do not have it
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("done") == 9 and s.total("failed") == 9 and s.complete
    assert all("does not exist on this worker" in reason for _, cell, reason in s.failures if cell.startswith("bad::"))
    registry = FailedJobRegistry(keys.queue_name("default"), connection=conn)
    assert registry.count == 9
    failed = rq_queue(conn).fetch_job(s.failures[0][0])
    assert failed.retries_left == 0 and "does not exist" in failed.meta["reason"]  # no retries for this
    r = CliRunner().invoke(cli, ["status", out.sweep_id, "--redis-url", conn_url(conn)])
    assert "failures (9 of 9 shown)" in r.output and "does not exist on this worker" in r.output

    shutil.copytree(tiny_model, missing)  # fix the cause, then retry
    again = cq.retry(conn, store, "default", out.sweep_id, key=KEY)
    assert len(again.enqueued) == 9 and again.done == 9
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("done") == 18 and s.n_failures == 0


def test_transient_failure_is_retried_with_backoff(conn, store, tiny_model, monkeypatch):
    import worker.engine.job
    from worker.core.errors import StoreError

    real, calls = worker.engine.job.run_job, []

    def flaky(job, **kw):
        calls.append(job.job_id)
        if calls.count(job.job_id) == 1 and len(set(calls)) == 1:
            raise StoreError("s3://bucket: write failed: SlowDown")
        return real(job, **kw)

    monkeypatch.setattr(worker.engine.job, "run_job", flaky)
    out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A", "B"])  # 2 jobs
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("done") == 2 and s.n_failures == 0
    first = rq_queue(conn).fetch_job(calls[0])
    assert calls.count(calls[0]) == 2 and first.retries_left == 2


def test_sigterm_requeues_the_running_job_and_exits(conn, store, tiny_model, monkeypatch):
    import worker.engine.job

    real, started = worker.engine.job.run_job, threading.Event()

    def slow_first(job, **kw):
        """The first job runs until the worker interrupts it (a bundled-model job can end before SIGTERM lands)."""
        if not started.is_set():
            started.set()
            time.sleep(60)
        return real(job, **kw)

    monkeypatch.setattr(worker.engine.job, "run_job", slow_first)
    out = submit(conn, store, tiny_model)
    victim: list[str] = []

    def stop_when_running():
        victim.append(wait_for(lambda: running_job(conn, out.sweep_id)))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_running, daemon=True).start()
    worker = run_worker(conn, stop_grace=0)
    # where the interrupt reached the job before run_job (in unavailable.before_job, while the job's code runs), the
    # job was requeued without calling slow_first, and the next worker's first job slept its 60 s (one run: 60.4 s)
    started.set()
    assert worker.get_state() != "busy"
    state = conn.hget(keys.sweep("default", out.sweep_id, "state"), victim[0])
    assert state == b"queued"
    assert rq_queue(conn).get_job_ids()[0] == victim[0]  # at the front, not failed
    assert sweepstate.read_status(conn, "default", out.sweep_id).n_failures == 0
    run_worker(conn)  # another worker finishes the sweep
    assert sweepstate.read_status(conn, "default", out.sweep_id).total("done") == 9


def test_cancel_stops_the_running_job_and_drops_the_queued_ones(conn, store, tiny_model):
    from rq.job import JobStatus

    out = submit(conn, store, tiny_model)
    victim: list[str] = []

    def cancel_when_running():
        victim.append(wait_for(lambda: running_job(conn, out.sweep_id)))
        sweepstate.cancel_sweep(conn, "default", out.sweep_id)

    threading.Thread(target=cancel_when_running, daemon=True).start()
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.cancelled and s.complete and s.total("cancelled") + s.total("done") == 9 and s.total("cancelled") >= 8
    job = rq_queue(conn).fetch_job(victim[0])
    assert job.get_status() in (JobStatus.STOPPED, JobStatus.FINISHED)


def test_dequeue_is_fair_across_tenants_then_by_priority_inside_a_tenant(conn, store, tmp_path):
    # Before issue 9 a worker took every tenant's high jobs before anyone's normal ones; now
    # tenants share the worker by weight (equal here) and priorities order a tenant's own jobs.
    for tenant, priority in (("team-a", "normal"), ("team-b", "normal"), ("team-b", "high"), ("team-c", "low")):
        spec = parse_spec(spec_dict(name=f"{tenant}-{priority}", prompts=["a", "b", "c"], shard_size=1, seeds=(1,)))
        cq.submit(conn, store, spec, tenant, priority, key=KEY)
    worker = make_worker(conn, ["*"])
    assert [q.name for q in worker._ordered_queues][:3] == [
        "decodebench.team-a.normal",
        "decodebench.team-b.high",
        "decodebench.team-b.normal",
    ]
    order = []
    for _ in range(6 * 4):
        job, queue = worker.dequeue_job_and_maintain_ttl(None)
        order.append(queue.name.removeprefix("decodebench."))
    assert order[:18] == ["team-a.normal", "team-b.high", "team-c.low"] * 6
    assert order[18:] == ["team-b.normal"] * 6


def test_rq_info_lists_decodebench_queues_and_workers(conn, store, redis_url):
    from rq.cli import main as rq_cli

    cq.submit(conn, store, parse_spec(spec_dict()), "default", key=KEY)
    worker = make_worker(conn, ["default"])
    worker.register_birth()
    try:
        r = CliRunner().invoke(rq_cli, ["info", "--url", redis_url])
    finally:
        worker.register_death()
    assert r.exit_code == 0, r.output
    assert "decodebench.default.normal" in r.output and worker.name in r.output


def test_sweep_resumes_after_redis_restarts_with_its_data(tiny_model, tmp_path, monkeypatch):
    import redis

    from tests.support.services import free_port, redis_server
    from worker.store import open_store

    port, data = free_port(), str(tmp_path / "redis-data")
    os.makedirs(data)
    store = open_store(os.environ["DECODEBENCH_STORE"])
    with redis_server(appendonly=True, data_dir=data, port=port) as (url, _):
        conn = redis.Redis.from_url(url)
        out = submit(conn, store, tiny_model, seeds=(1,))
        run_worker(conn, max_jobs=2)
    with redis_server(appendonly=True, data_dir=data, port=port) as (url, _):
        conn = redis.Redis.from_url(url)
        assert sweepstate.read_status(conn, "default", out.sweep_id).total("done") == 2
        run_worker(conn)
        s = sweepstate.read_status(conn, "default", out.sweep_id)
        assert s.complete and s.total("done") == 6
