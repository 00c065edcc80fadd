"""Every write to a sweep's job states in Redis, and the Lua that makes each one atomic.

A job's state lives in `decodebench:<t>:sweep:<id>:state` (job id -> JobStatus value)
with per-cell counters in `...:counts` that the same Lua step updates, so counters never
drift from the states and a repeated transition counts once. Only this module writes
them: the worker's task and reaper, and the controller's submit and cancel, call it.
Reads are in `worker.sweepstate.reads` and never change anything.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from string import Template

from worker.core import keys
from worker.core.contract import JobStatus
from worker.sweepstate.reads import sweep_liveness

CHUNK = 5000  # jobs per pipeline or Lua call
NONE = "none"  # the state of a job the sweep has never recorded (not a JobStatus)
States = tuple[JobStatus | str, ...] | str


class Lua:
    """A Lua script run with EVALSHA on whichever client or pipeline is given (reloaded after
    a Redis restart). One object per script source: nothing is keyed on a connection."""

    def __init__(self, source: str) -> None:
        # job states are spelled by JobStatus: $QUEUED, $RUNNING, $DONE, $FAILED, $CANCELLED
        self.source = Template(source).substitute({s.name: s.value for s in JobStatus})
        self._script = None

    def __call__(self, client, keys: list[str], args: list | None = None):
        from redis.commands.core import Script

        if self._script is None:
            self._script = Script(client, self.source)  # the client only encodes the source here
        return self._script(keys=keys, args=args or [], client=client)


def _value(state: JobStatus | str) -> str:
    return state.value if isinstance(state, JobStatus) else str(state)


def _allowed(allowed: States) -> str:
    return allowed if isinstance(allowed, str) else ",".join(_value(s) for s in allowed)


_TRANSITION = Lua("""
local old = redis.call('HGET', KEYS[1], ARGV[1])
local oldname = old or 'none'
if old == ARGV[3] then return {0, oldname} end
if ARGV[4] ~= '*' then
  local ok = false
  for s in string.gmatch(ARGV[4], '[^,]+') do
    if s == oldname then ok = true end
  end
  if not ok then return {0, oldname} end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if old then redis.call('HINCRBY', KEYS[2], ARGV[2] .. '|' .. old, -1) end
redis.call('HINCRBY', KEYS[2], ARGV[2] .. '|' .. ARGV[3], 1)
local ttl = redis.call('TTL', KEYS[1])
if ARGV[3] == '$FAILED' then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
  if ttl > 0 then redis.call('EXPIRE', KEYS[3], ttl) end
else
  redis.call('HDEL', KEYS[3], ARGV[1])
end
if ARGV[3] == '$RUNNING' then redis.call('HSETNX', KEYS[4], 'started_at', ARGV[6]) end
if ARGV[3] == '$DONE' then
  redis.call('HINCRBY', KEYS[4], 'new_tokens', tonumber(ARGV[7]))
  redis.call('HINCRBY', KEYS[4], 'generations', tonumber(ARGV[8]))
  redis.call('HSET', KEYS[4], 'last_done_at', ARGV[6])
  redis.call('LPUSH', KEYS[5], ARGV[6])
  redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[9]) - 1)
  if ttl > 0 then redis.call('EXPIRE', KEYS[5], ttl) end
end
return {1, oldname}
""")

_TRANSITION_MANY = Lua("""
local new = ARGV[1]
local applied = 0
for i = 2, #ARGV, 3 do
  local job, cell, allowed = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local old = redis.call('HGET', KEYS[1], job)
  local oldname = old or 'none'
  if old ~= new and (allowed == '*' or string.find(',' .. allowed .. ',', ',' .. oldname .. ',', 1, true)) then
    redis.call('HSET', KEYS[1], job, new)
    if old then redis.call('HINCRBY', KEYS[2], cell .. '|' .. old, -1) end
    redis.call('HINCRBY', KEYS[2], cell .. '|' .. new, 1)
    redis.call('HDEL', KEYS[3], job)
    applied = applied + 1
  end
end
return applied
""")


_CANCEL_QUEUED = Lua("""
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i + 1] == '$QUEUED' then
    local cell = redis.call('HGET', KEYS[3], all[i]) or '?'
    redis.call('HSET', KEYS[1], all[i], '$CANCELLED')
    redis.call('HINCRBY', KEYS[2], cell .. '|$QUEUED', -1)
    redis.call('HINCRBY', KEYS[2], cell .. '|$CANCELLED', 1)
    table.insert(out, all[i])
  end
end
return out
""")

_DROP_FROM_QUEUE = Lua("""
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
local keep = {}
local dropped = 0
for _, id in ipairs(ids) do
  if redis.call('HGET', KEYS[2], id) == '$CANCELLED' then dropped = dropped + 1 else table.insert(keep, id) end
end
if dropped > 0 then
  redis.call('DEL', KEYS[1])
  for i = 1, #keep, 5000 do
    redis.call('RPUSH', KEYS[1], unpack(keep, i, math.min(i + 4999, #keep)))
  end
end
return dropped
""")


def transition(
    conn,
    tenant: str,
    sweep_id: str,
    job_id: str,
    cell: str,
    state: JobStatus,
    *,
    allowed: States = "*",
    reason: str = "",
    new_tokens: int = 0,
    generations: int = 0,
    pipeline=None,
) -> tuple[bool, str] | None:
    """Move a job to `state` if its current state ('none' if unknown) is in `allowed`.

    Returns (applied, previous state); None when queued on a pipeline.
    """
    k = keys.sweep_keys(tenant, sweep_id)
    args = [
        job_id,
        cell,
        _value(state),
        _allowed(allowed),
        reason[:500],
        f"{time.time():.3f}",
        new_tokens,
        generations,
        keys.RECENT,
    ]
    out = _TRANSITION(pipeline or conn, [k["state"], k["counts"], k["failures"], k["meta"], k["recent"]], args)
    if pipeline is not None:
        return None
    applied, old = out
    return bool(applied), old.decode() if isinstance(old, bytes) else old


def transition_many(conn, tenant: str, sweep_id: str, items, state: JobStatus, *, pipeline=None):
    """Bulk `transition` (no reasons, no meta): items are (job id, cell, allowed states)."""
    k = keys.sweep_keys(tenant, sweep_id)
    args: list[str] = [_value(state)]
    for job_id, cell, allowed in items:
        args += [job_id, cell, _allowed(allowed)]
    return _TRANSITION_MANY(pipeline or conn, [k["state"], k["counts"], k["failures"]], args)


def register_sweep(pipe, tenant: str, sweep_id: str, jobs, meta: dict, *, resume: bool, created_at: str) -> None:
    """Record a submitted sweep (on a pipeline): its meta, its jobs' cells, its place in the
    tenant's index; `resume` clears a cancellation and renews the epoch (worker.sweepstate.unavailable)
    because jobs are being enqueued again."""
    k = keys.sweep_keys(tenant, sweep_id)
    pipe.hsetnx(k["meta"], "created_at", created_at)
    pipe.hset(k["meta"], mapping=meta)
    if resume:
        pipe.hdel(k["meta"], "cancelled", "finished_at")
        pipe.hset(k["meta"], "epoch", created_at)  # a new try: models marked unavailable are tried again
    pipe.zadd(keys.sweeps(tenant), {sweep_id: time.time()}, nx=True)
    for i in range(0, len(jobs), CHUNK):
        pipe.hset(k["cells"], mapping={j.job_id: j.cell for j in jobs[i : i + CHUNK]})


def expire_sweep(conn, tenant: str, sweep_id: str, ttl_s: int) -> None:
    """A sweep's keys live `ttl_s` after its last submit or retry."""
    with conn.pipeline(transaction=False) as pipe:
        for key in keys.sweep_keys(tenant, sweep_id).values():
            pipe.expire(key, ttl_s)
        pipe.execute()


def prune_expired_sweeps(conn, tenant: str) -> list[str]:
    """Drop from the tenant's index the sweeps whose keys expired (a write: submit calls it)."""
    expired = [m for m, alive in sweep_liveness(conn, tenant) if not alive]
    if expired:
        conn.zrem(keys.sweeps(tenant), *expired)
    return expired


def forget_sweep(conn, tenant: str, sweep_id: str) -> int:
    """Drop a sweep with nothing queued or running from Redis (its keys, its jobs' RQ hashes and registry
    entries, its place in the index) to make room under the tenant's quota.held_jobs; its results, logs
    and spec stay in the store. Returns how many jobs it recorded."""
    from worker.core import rqadapter

    k = keys.sweep_keys(tenant, sweep_id)
    job_ids = [j.decode() for j, _ in conn.hscan_iter(k["cells"], count=CHUNK)]
    queues = keys.tenant_queues(tenant)
    for i in range(0, len(job_ids), CHUNK):
        part = job_ids[i : i + CHUNK]
        with conn.pipeline(transaction=False) as pipe:
            pipe.delete(*(keys.rq_job_key(tenant, j) for j in part))
            rqadapter.drop_from_registries(pipe, queues, part)
            pipe.hdel(keys.lost(tenant), *part)
            pipe.execute()
    with conn.pipeline(transaction=False) as pipe:
        pipe.delete(*k.values())
        pipe.zrem(keys.sweeps(tenant), sweep_id)
        pipe.execute()
    return len(job_ids)


# -- running jobs: heartbeats and losses -----------------------------------------------------


def heartbeat_job(
    conn, tenant: str, sweep_id: str, job_id: str, cell: str, ttl: float, *, create: bool = False
) -> None:
    """Push the job's deadline in `decodebench:<t>:running` (create: when the job starts, with the worker's TTL
    beside it, `running_ttl`, by which status judges the job's beats)."""
    member = keys.running_member(sweep_id, job_id, cell)
    if not create:
        conn.zadd(keys.running(tenant), {member: time.time() + ttl}, xx=True)
        return
    with conn.pipeline(transaction=False) as pipe:
        pipe.zadd(keys.running(tenant), {member: time.time() + ttl})
        pipe.hset(keys.running_ttls(tenant), member, f"{ttl:g}")
        pipe.execute()


def forget_job(conn, tenant: str, sweep_id: str, job_id: str, cell: str) -> None:
    member = keys.running_member(sweep_id, job_id, cell)
    with conn.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.running(tenant), member)
        pipe.hdel(keys.running_ttls(tenant), member)
        pipe.execute()


def claim_lost(conn, tenant: str) -> list[tuple[str, str, str]]:
    """(sweep id, job id, cell) of the running jobs past their deadline, each claimed by
    exactly one caller (ZREM decides between concurrent reapers)."""
    zkey = keys.running(tenant)
    claimed = [raw for raw in conn.zrangebyscore(zkey, 0, time.time()) if conn.zrem(zkey, raw)]
    if claimed:
        conn.hdel(keys.running_ttls(tenant), *claimed)
    return [keys.split_running_member(raw.decode()) for raw in claimed]


def record_loss(conn, tenant: str, sweep_id: str, job_id: str) -> int:
    """Count one loss of the job with its worker; return how often it was lost."""
    losses = conn.hincrby(keys.lost(tenant), job_id, 1)
    conn.hincrby(keys.sweep(tenant, sweep_id, "meta"), "lost", 1)
    return losses


def forget_losses(pipe, tenant: str, job_ids: list[str]) -> None:
    """A resubmitted job starts its loss count afresh."""
    if job_ids:
        pipe.hdel(keys.lost(tenant), *job_ids)


# -- cancel ---------------------------------------------------------------------------------


@dataclass
class CancelOutcome:
    cancelled: int
    stopping: list[str]
    idle: bool = False  # nothing was queued or running: the sweep was left as it ended, not marked cancelled


def cancel_sweep(conn, tenant: str, sweep_id: str) -> CancelOutcome:
    """Stop the sweep's queued jobs (removed from the queues) and ask running ones to stop. A sweep with no
    job queued or running is left as it ended (its mark would have kept a finished sweep `[CANCELLED]`)."""
    from worker.core import rqadapter

    k = keys.sweep_keys(tenant, sweep_id)
    if not _has_live_jobs(conn, k["counts"]):
        return CancelOutcome(0, [], idle=True)
    conn.hset(k["meta"], "cancelled", f"{time.time():.3f}")
    ids = [i.decode() for i in _CANCEL_QUEUED(conn, [k["state"], k["counts"], k["cells"]])]
    for name in keys.tenant_queues(tenant):
        _DROP_FROM_QUEUE(conn, [keys.rq_queue_key(name), k["state"]])
    own, fallback = set(keys.tenant_queues(tenant)), keys.queue_name(tenant)
    at = time.time()
    for i in range(0, len(ids), CHUNK):
        part = ids[i : i + CHUNK]
        by_queue: dict[str, list[str]] = {}  # each job in its own queue's registry (engines differ)
        for job_id, origin in zip(part, rqadapter.job_origins(conn, tenant, part), strict=True):
            by_queue.setdefault(origin if origin in own else fallback, []).append(job_id)
        with conn.pipeline(transaction=False) as pipe:
            for queue, members in by_queue.items():
                rqadapter.mark_canceled(pipe, tenant, queue, members, keys.FAILURE_TTL, at)
            pipe.execute()
    stopping = []
    for raw in conn.zrange(keys.running(tenant), 0, -1):
        s, job_id, _cell = keys.split_running_member(raw.decode())
        if s == sweep_id:
            _send_stop(conn, tenant, job_id)
            stopping.append(job_id)
    return CancelOutcome(len(ids), stopping)


def _has_live_jobs(conn, counts_key: str) -> bool:
    """Whether a cell counts a queued or running job (`...:counts`: `<cell>|<state>` -> n)."""
    live = (f"|{JobStatus.QUEUED.value}", f"|{JobStatus.RUNNING.value}")
    counts = conn.hgetall(counts_key)
    return any(f.decode(errors="replace").endswith(live) and n.isdigit() and int(n) > 0 for f, n in counts.items())


def _send_stop(conn, tenant: str, job_id: str) -> None:
    """RQ's stop-job command to the job's worker, when this Redis user may publish it. A tenant's
    user may not (it could stop other tenants' jobs): its workers see the sweep's cancelled
    flag within one heartbeat instead."""
    from worker.core import rqadapter

    with contextlib.suppress(Exception):  # not executing any more, or no right to publish
        rqadapter.send_stop_job(conn, tenant, job_id)
