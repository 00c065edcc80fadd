"""A tenant's running slots (`max_running` across all workers) and its worker time.

`take_job` is one Lua step: drop the slots whose deadline passed (their worker died),
and only if fewer than `max_running` remain, move the next job id from the queue to RQ's
intermediate list and hold a slot for it until now + heartbeat TTL. The running job's
heartbeat pushes the deadline (`extend_slot`), its end frees it (`release_slot`), so a
killed worker's slot frees itself within one heartbeat TTL. Workers alone write these keys
(a tenant's Redis user may not: it cannot free its own quota).

A job's run lock (`keys.run_lock`, `hold_run`) is taken before the job starts and held by its
heartbeat: a job id dequeued twice (pushed twice, or taken by two workers) runs only where the
lock is held; the other copy is dropped. The reaper drops the lock of a job it requeues.
"""

from __future__ import annotations

import time

from worker.core import keys
from worker.sweepstate.reads import USAGE_WINDOW_S
from worker.sweepstate.transitions import Lua

_TAKE = Lua("""
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[2]) then return false end
local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
if not id then return false end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), id)
return id
""")


def take_job(conn, tenant: str, queue_key: str, intermediate_key: str, max_running: int, ttl: float) -> str | None:
    """The next job id of the queue if the tenant has a free slot (atomic across workers), else None."""
    out = _TAKE(conn, [queue_key, intermediate_key, keys.slots(tenant)], [f"{time.time():.6f}", max_running, ttl])
    return out.decode() if out else None


def extend_slot(conn, tenant: str, job_id: str, ttl: float) -> None:
    conn.zadd(keys.slots(tenant), {job_id: time.time() + ttl}, xx=True)


def release_slot(conn, tenant: str, job_id: str) -> None:
    conn.zrem(keys.slots(tenant), job_id)


def record_usage(conn, tenant: str, job_id: str, started: float, ended: float) -> None:
    """One job's worker time, kept for an hour (status --all-tenants)."""
    key = keys.usage(tenant)
    with conn.pipeline(transaction=False) as pipe:
        pipe.zadd(key, {f"{started:.3f} {ended:.3f} {job_id}": ended})
        pipe.zremrangebyscore(key, "-inf", ended - USAGE_WINDOW_S)
        pipe.expire(key, int(USAGE_WINDOW_S) * 2)
        pipe.execute()


_EXTEND_RUN = Lua("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
""")
_RELEASE_RUN = Lua("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")


def hold_run(conn, tenant: str, job_id: str, holder: str, ttl: float) -> bool:
    """Take the job's run lock for `holder` (a worker name) for `ttl` seconds; False if another holds it."""
    return bool(conn.set(keys.run_lock(tenant, job_id), holder, nx=True, px=max(1, int(ttl * 1000))))


def claim_run(conn, tenant: str, job_id: str, holder: str, ttl: float, status: str | None) -> str | None:
    """A worker's claim of a dequeued job: its run lock for `holder`, unless another holds it; a job
    already in a final `status` (finished, failed, ...) gives its lock and its slot (none for a report
    job) back. Why it must not run, or None if it may."""
    if not hold_run(conn, tenant, job_id, holder, ttl):
        return "another worker runs it"
    if status is not None:
        release_slot(conn, tenant, job_id)
        release_run(conn, tenant, job_id, holder)
        return f"it is {status} already"
    return None


def extend_run(conn, tenant: str, job_id: str, holder: str, ttl: float) -> None:
    _EXTEND_RUN(conn, [keys.run_lock(tenant, job_id)], [holder, max(1, int(ttl * 1000))])


def release_run(conn, tenant: str, job_id: str, holder: str) -> None:
    """Release the run lock if `holder` still holds it."""
    _RELEASE_RUN(conn, [keys.run_lock(tenant, job_id)], [holder])


def drop_run(conn, tenant: str, job_id: str) -> None:
    """The reaper's: the job's worker is gone, whoever requeued the job owns it now."""
    conn.delete(keys.run_lock(tenant, job_id))
