"""Fair share and quotas across tenants: real worker processes (forked) on a real redis-server,
running a fake job function (a few milliseconds) instead of a model, so that hundreds of jobs
take seconds. The bounds asserted are derived in worker/rq/fair.py and docs/tenants.md."""

from __future__ import annotations

import multiprocessing
import os
import time
import types

import pytest
import redis

from tests.support.queue import submit_tenant_jobs
from worker import sweepstate
from worker.core import keys
from worker.core.tenants import parse_tenants
from worker.sweepstate import slots

JOB_S = 0.01


def fake_run_job(spec, *, store, runtime):
    """Stands in for the engine: counts how many jobs of the tenant run at this moment."""
    conn = redis.Redis.from_url(os.environ["FAIRNESS_REDIS_URL"])
    now = conn.incr(f"test:concurrent:{spec.tenant}")
    conn.rpush(f"test:samples:{spec.tenant}", now)
    time.sleep(float(os.environ.get("FAIRNESS_JOB_S", JOB_S)))
    conn.decr(f"test:concurrent:{spec.tenant}")
    return {"new_tokens": 1}


def _serve(url: str, selectors: list[str], tenants: dict | None, max_jobs: int | None) -> None:
    import worker.engine.job
    from worker.rq.reaper import Timing
    from worker.rq.worker import decodebench_worker
    from worker.store import FileStore

    worker.engine.job.run_job = fake_run_job
    conn = redis.Redis.from_url(url)
    w = decodebench_worker(
        selectors,
        connection=conn,
        store=FileStore(os.environ["DECODEBENCH_STORE"]),
        runtime=types.SimpleNamespace(device="cpu"),
        timing=Timing(heartbeat_ttl=5.0, reaper_interval=0.5),
        tenants=parse_tenants(tenants) if tenants else None,
    )
    w.work(burst=True, max_jobs=max_jobs, logging_level="WARNING")


def start_workers(url: str, n: int, selectors, tenants=None, max_jobs=None):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_serve, args=(url, list(selectors), tenants, max_jobs)) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def stop(procs, timeout: float = 60) -> None:
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()


@pytest.fixture()
def conn(redis_url, monkeypatch):
    monkeypatch.setenv("FAIRNESS_REDIS_URL", redis_url)
    return redis.Redis.from_url(redis_url)


def done(conn, tenant: str, sweep_id: str) -> int:
    return sweepstate.read_status(conn, tenant, sweep_id).total("done")


@pytest.fixture()
def store(tmp_path):
    from worker.store import open_store

    return open_store(os.environ["DECODEBENCH_STORE"])


def test_a_late_small_tenant_is_served_at_once_beside_a_large_backlog(conn, store, redis_url):
    """A: 300 jobs, then B: 10, 2 workers, equal weights. Each worker alternates A and B while B
    has jobs (stride scheduling, B joins at A's pass), so while B's 10 jobs run at most
    10 + 2 x 2 of A's finish: one alternate per B job, plus per worker the job in flight when B
    arrived and the one taken before B's first."""
    a = submit_tenant_jobs(conn, store, "team-a", 300, "big")
    procs = start_workers(redis_url, 2, ["team-a", "team-b"])
    try:
        deadline = time.monotonic() + 60
        while done(conn, "team-a", a.sweep_id) < 10 and time.monotonic() < deadline:
            time.sleep(0.002)
        b = submit_tenant_jobs(conn, store, "team-b", 10, "small")
        a_at_submit = done(conn, "team-a", a.sweep_id)
        while done(conn, "team-b", b.sweep_id) < 10 and time.monotonic() < deadline:
            time.sleep(0.002)
        a_at_finish = done(conn, "team-a", a.sweep_id)
    finally:
        for p in procs:
            p.kill()
        stop(procs)
    assert done(conn, "team-b", b.sweep_id) == 10
    assert a_at_finish - a_at_submit <= 10 + 2 * 2, (a_at_submit, a_at_finish)
    assert 300 - a_at_finish >= 250  # most of A's jobs still wait


def test_weights_3_to_1_share_completed_jobs_3_to_1(conn, store, redis_url):
    """Both backlogged, weights 3:1, 2 workers x 40 jobs: per worker the stride bound keeps
    |n_A/3 - n_B| <= 1, so A's share of the 80 is 0.75 within 0.05."""
    a = submit_tenant_jobs(conn, store, "team-a", 120, "a")
    b = submit_tenant_jobs(conn, store, "team-b", 120, "b")
    tenants = {"tenants": [{"name": "team-a", "weight": 3}, {"name": "team-b", "weight": 1}]}
    stop(start_workers(redis_url, 2, ["*"], tenants, max_jobs=40))
    n_a, n_b = done(conn, "team-a", a.sweep_id), done(conn, "team-b", b.sweep_id)
    assert n_a + n_b == 80
    assert abs(n_a / 80 - 0.75) <= 0.05, (n_a, n_b)


def test_max_running_holds_across_three_workers(conn, store, redis_url, monkeypatch):
    """team-q has max_running 1: sampled at every job start and by polling its live slots,
    never 2 at once, while the 3 workers run team-r's jobs side by side."""
    monkeypatch.setenv("FAIRNESS_JOB_S", "0.05")
    q = submit_tenant_jobs(conn, store, "team-q", 12, "q")
    r = submit_tenant_jobs(conn, store, "team-r", 40, "r")
    tenants = {"tenants": [{"name": "team-q", "max_running": 1}, {"name": "team-r"}]}
    procs = start_workers(redis_url, 3, ["team-q", "team-r"], tenants)
    polled = []
    deadline = time.monotonic() + 60
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        polled.append(conn.zcount(keys.slots("team-q"), time.time(), "+inf"))  # its live slots
        time.sleep(0.005)
    stop(procs)
    samples_q = [int(x) for x in conn.lrange("test:samples:team-q", 0, -1)]
    samples_r = [int(x) for x in conn.lrange("test:samples:team-r", 0, -1)]
    assert done(conn, "team-q", q.sweep_id) == 12 and done(conn, "team-r", r.sweep_id) == 40
    assert len(samples_q) == 12 and max(samples_q) == 1 and max(polled) == 1
    assert max(samples_r) >= 2  # the workers did run jobs side by side


def test_a_dead_workers_slot_frees_itself_after_the_heartbeat_ttl(conn):
    queue = keys.rq_queue_key(keys.queue_name("team-q"))
    conn.rpush(queue, "j1", "j2")
    target = queue + ":intermediate"
    assert slots.take_job(conn, "team-q", queue, target, 1, ttl=0.2) == "j1"
    assert slots.take_job(conn, "team-q", queue, target, 1, ttl=0.2) is None  # quota reached
    time.sleep(0.3)  # j1's worker died: no heartbeat pushed its deadline
    assert slots.take_job(conn, "team-q", queue, target, 1, ttl=0.2) == "j2"


def test_a_job_id_pushed_three_times_runs_once(conn, store, redis_url, monkeypatch):
    """The same id three times in team-q's queue (max_running 2), three workers: it runs once; the
    copies are dropped, never run beside it nor failed, and the quota holds."""
    monkeypatch.setenv("FAIRNESS_JOB_S", "0.5")
    q = submit_tenant_jobs(conn, store, "team-q", 2, "dup")  # one prompt: greedy and top_k
    twice = q.enqueued[0]
    conn.rpush(keys.rq_queue_key(keys.queue_name("team-q")), twice, twice)
    tenants = {"tenants": [{"name": "team-q", "max_running": 2}]}
    stop(start_workers(redis_url, 3, ["team-q"], tenants))
    runs = [m.decode().split()[2] for m in conn.zrange(keys.usage("team-q"), 0, -1)]
    assert sorted(runs) == sorted(q.enqueued)  # each job once
    samples_q = [int(x) for x in conn.lrange("test:samples:team-q", 0, -1)]
    assert len(samples_q) == 2 and max(samples_q) <= 2
    assert done(conn, "team-q", q.sweep_id) == 2 and conn.zcount(keys.slots("team-q"), time.time(), "+inf") == 0
    queue = keys.rq_queue_key(keys.queue_name("team-q"))
    assert conn.llen(queue) == 0 and conn.llen(queue + ":intermediate") == 0
