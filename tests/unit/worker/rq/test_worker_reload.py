"""A running worker follows its tenants file (worker.rq.reload): a real worker process (forked) on a
real redis-server, the tenants file replaced under it the way the kubelet updates a ConfigMap
volume (a new file swapped in), a fake job function standing in for the model.

A tenant added to the file is served by a `*` worker from its first job, under its policy (a
model it may not load is refused, never run unpoliced); the job running during the change runs
to its end; a file that no longer parses leaves the last valid one in force.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import time
import types

import pytest
import redis
import yaml

from tests.support.queue import submit_tenant_jobs
from tests.support.worker import reason
from worker import sweepstate
from worker.core import keys
from worker.core.tenants import parse_tenants
from worker.rq.reload import declared_queue_names

MODEL = "/nonexistent/model"  # spec_dict's: the fake job function never loads it


def slow_run_job(spec, *, store, runtime):
    conn = redis.Redis.from_url(os.environ["RELOAD_REDIS_URL"])
    conn.rpush("test:ran", f"{spec.tenant} {spec.job_id}")
    time.sleep(float(conn.get("test:job_s") or 0.01))
    return {"new_tokens": 3}


def _serve(url: str) -> None:
    import worker.engine.job
    from worker.rq.reaper import Timing
    from worker.rq.worker import decodebench_worker
    from worker.store import FileStore

    worker.engine.job.run_job = slow_run_job
    w = decodebench_worker(
        ["*"],
        connection=redis.Redis.from_url(url),
        store=FileStore(os.environ["DECODEBENCH_STORE"]),
        runtime=types.SimpleNamespace(device="cpu"),
        timing=Timing(heartbeat_ttl=5.0, reaper_interval=0.3),
        tenants_file=os.environ["DECODEBENCH_TENANTS_FILE"],  # as the worker's command line passes it
    )
    w.work(logging_level="WARNING")


def write_tenants(path, tenants: list[dict] | str) -> None:
    """Replace the file at once (the kubelet swaps a ConfigMap volume's symlink)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(tenants if isinstance(tenants, str) else yaml.safe_dump({"tenants": tenants}))
    os.replace(tmp, path)


def in_force(conn) -> set[bytes | None]:
    """The tenants files in force in the workers' RQ hashes (their SHA-256)."""
    workers = [k for k in conn.scan_iter("rq:worker:*") if conn.type(k) == b"hash"]
    return {conn.hget(k, "tenants_sha256") for k in workers}


def taken(conn, path) -> None:
    """Wait until the worker has taken the file now at `path` (no sleeping on its reload period)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest().encode()
    wait_for(lambda: in_force(conn) == {digest})


def wait_for(check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture()
def setup(redis_url, tmp_path, monkeypatch):
    from worker.store import open_store

    path = tmp_path / "tenants.yaml"
    write_tenants(path, [{"name": "team-a"}])
    monkeypatch.setenv("DECODEBENCH_TENANTS_FILE", str(path))
    monkeypatch.setenv("RELOAD_REDIS_URL", redis_url)
    conn = redis.Redis.from_url(redis_url)
    proc = multiprocessing.get_context("fork").Process(target=_serve, args=(redis_url,))
    yield conn, open_store(os.environ["DECODEBENCH_STORE"]), path, proc
    if proc.pid:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)


def done(conn, tenant: str, sweep_id: str) -> int:
    return sweepstate.read_status(conn, tenant, sweep_id).total("done")


def test_a_new_tenant_is_served_under_its_policy_and_the_running_job_runs_on(setup):
    conn, store, path, proc = setup
    conn.set("test:job_s", 3)
    a = submit_tenant_jobs(conn, store, "team-a", 2, "long")  # two jobs (two strategies), the first of 3 s
    b = submit_tenant_jobs(conn, store, "team-b", 2, "newcomer")
    proc.start()
    wait_for(lambda: conn.llen("test:ran") == 1)  # team-a's job runs; team-b is not served
    conn.set("test:job_s", 0.01)
    write_tenants(path, [{"name": "team-a"}, {"name": "team-b", "max_running": 1, "models": ["/other/model"]}])
    wait_for(lambda: sweepstate.read_status(conn, "team-b", b.sweep_id).total("failed") == 2)
    # the sweep state is marked just before RQ records the failure in the job's hash: wait for both
    wait_for(lambda: all(rq_status(conn, "team-b", job_id) == b"failed" for job_id in b.enqueued))
    for job_id in b.enqueued:
        assert reason(conn, job_id, "team-b") == f"refused: model '{MODEL}' is not among tenant team-b's models"
    wait_for(lambda: done(conn, "team-a", a.sweep_id) == 2)  # the job running during the change finished
    assert all(ran.startswith(b"team-a ") for ran in conn.lrange("test:ran", 0, -1))  # team-b's never ran

    allowed = [{"name": "team-a"}, {"name": "team-b", "max_running": 1, "models": [MODEL]}]
    write_tenants(path, allowed)
    taken(conn, path)
    c = submit_tenant_jobs(conn, store, "team-b", 2, "allowed")
    wait_for(lambda: done(conn, "team-b", c.sweep_id) == 2)

    valid = in_force(conn)
    write_tenants(path, "tenants: [{name: team-a, weight: -1}]\n")  # invalid: the last valid file stays
    time.sleep(1)  # a reload period or so (nothing to wait on: nothing changes)
    assert in_force(conn) == valid  # the hash still names the last valid file
    d = submit_tenant_jobs(conn, store, "team-b", 2, "after a bad file")
    wait_for(lambda: done(conn, "team-b", d.sweep_id) == 2)

    write_tenants(path, [{"name": "team-a"}])  # team-b removed: its jobs wait, none is failed
    taken(conn, path)
    e = submit_tenant_jobs(conn, store, "team-b", 2, "removed")
    time.sleep(1)
    assert conn.llen(keys.rq_queue_key(keys.queue_name("team-b"))) == len(e.enqueued) == 2
    assert sweepstate.read_status(conn, "team-b", e.sweep_id).total("failed") == 0


def test_a_job_taken_as_its_tenant_leaves_the_file_goes_back_to_its_queue(redis_url, tmp_path):
    """The race in the test above, made certain: the main thread's dequeue polls the queues it was
    given while the heartbeat thread applies a file without team-b. The job it took goes back to the
    front of team-b's queue with its slot; before, it was failed ("not declared"), and CI saw it."""
    from tests.support.worker import make_worker
    from worker.rq.reload import reload_tenants
    from worker.store import open_store

    path = tmp_path / "tenants.yaml"
    write_tenants(path, [{"name": "team-a"}, {"name": "team-b", "max_running": 1}])
    conn = redis.Redis.from_url(redis_url)
    b = submit_tenant_jobs(conn, open_store(os.environ["DECODEBENCH_STORE"]), "team-b", 2, "removed while taken")
    worker = make_worker(conn, ["*"], tenants_file=str(path))
    job, queue = worker.dequeue_job_and_maintain_ttl(None)
    assert job.id == b.enqueued[0] and conn.zcard(keys.slots("team-b")) == 1  # the dequeue took a slot
    write_tenants(path, [{"name": "team-a"}])
    assert reload_tenants(worker.logic) and "team-b" not in worker.tenants
    worker.execute_job(job, queue)
    assert [j.decode() for j in conn.lrange(queue.key, 0, -1)] == b.enqueued  # at the front, in order
    assert conn.llen(queue.intermediate_queue_key) == 0 and conn.zcard(keys.slots("team-b")) == 0
    assert rq_status(conn, "team-b", job.id) == b"queued"
    state = sweepstate.read_status(conn, "team-b", b.sweep_id)
    assert state.total("queued") == 2 and state.total("failed") == 0


def test_declared_queue_names_follow_the_file():
    two = parse_tenants({"tenants": [{"name": "team-a"}, {"name": "team-b"}]})
    names, undeclared = declared_queue_names(["*"], two)
    assert names == keys.engine_queues("team-a") + keys.engine_queues("team-b") and undeclared == []
    names, undeclared = declared_queue_names(["team-a,team-x", "decodebench.team-b.high"], two)
    assert names == [*keys.engine_queues("team-a"), "decodebench.team-b.high"] and undeclared == ["team-x"]


def rq_status(conn, tenant: str, job_id: str) -> bytes | None:
    return conn.hget(keys.rq_job_key(tenant, job_id), "status")
