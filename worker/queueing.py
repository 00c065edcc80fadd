"""The distributed bookkeeping shared by workers and the controller (no torch here).

- `execute(job_dict)` is the module-level function RQ calls: it records the job's
  state transitions in the sweep's Redis counters and calls `worker.job.run_job`.
- `transition(...)` moves one job between queued/running/done/failed/cancelled with a
  Lua script that updates the per-cell counters in the same atomic step, so counters
  never drift from the per-job states and a repeated transition counts once.
- `reap(...)` finds jobs whose worker stopped heartbeating (killed, OOM, lost node)
  and requeues them, at most `max_lost` times per job; every worker runs it on a
  timer and `decodebench status` runs it too.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import structlog

from worker import keys
from worker.errors import DecodebenchError, PermanentJobError, UsageError

log = structlog.get_logger("decodebench.queueing")

FUNC = "worker.queueing.execute"


@dataclass(frozen=True)
class Timing:
    """Failure-detection timings (seconds); see docs/distributed.md for the bounds they give."""

    heartbeat_ttl: float = 60.0  # a running job whose worker is silent this long is lost
    reaper_interval: float = 15.0  # how often every worker looks for lost jobs
    max_lost: int = 3  # a job lost this many times fails instead of being requeued again

    @property
    def beat(self) -> float:
        return max(0.2, self.heartbeat_ttl / 6)

    @classmethod
    def from_env(cls, **overrides: Any) -> "Timing":
        env = os.environ
        values = {
            "heartbeat_ttl": float(env.get("DECODEBENCH_HEARTBEAT_TTL", cls.heartbeat_ttl)),
            "reaper_interval": float(env.get("DECODEBENCH_REAPER_INTERVAL", cls.reaper_interval)),
            "max_lost": int(env.get("DECODEBENCH_MAX_LOST", cls.max_lost)),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def detection_bound(self) -> float:
        """Longest time from a worker's death to its job being requeued (one reaper alive)."""
        return self.heartbeat_ttl + self.reaper_interval


# -- state transitions ----------------------------------------------------------------------

_TRANSITION = """
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
if ARGV[3] == 'failed' then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
  if ttl > 0 then redis.call('EXPIRE', KEYS[3], ttl) end
else
  redis.call('HDEL', KEYS[3], ARGV[1])
end
if ARGV[3] == 'running' then redis.call('HSETNX', KEYS[4], 'started_at', ARGV[6]) end
if ARGV[3] == 'done' then
  redis.call('HINCRBY', KEYS[4], 'new_tokens', tonumber(ARGV[7]))
  redis.call('HINCRBY', KEYS[4], 'generations', tonumber(ARGV[8]))
  redis.call('HSET', KEYS[4], 'last_done_at', ARGV[6])
  redis.call('LPUSH', KEYS[5], ARGV[6])
  redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[9]) - 1)
  if ttl > 0 then redis.call('EXPIRE', KEYS[5], ttl) end
end
return {1, oldname}
"""

_TRANSITION_MANY = """
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
"""

_scripts: dict[tuple[int, str], Any] = {}


def script(conn, source: str):
    """A registered Lua script per connection (EVALSHA, reloaded after a Redis restart)."""
    key = (id(conn), source)
    if key not in _scripts:
        _scripts[key] = conn.register_script(source)
    return _scripts[key]


def transition(conn, tenant: str, sweep_id: str, job_id: str, cell: str, state: str, *,
               allowed: tuple[str, ...] | str = "*", reason: str = "", new_tokens: int = 0,
               generations: int = 0, pipeline=None) -> tuple[bool, str] | None:
    """Move a job to `state` if its current state ('none' if unknown) is in `allowed`.

    Returns (applied, previous state); None when queued on a pipeline.
    """
    k = keys.sweep_keys(tenant, sweep_id)
    allowed_arg = allowed if isinstance(allowed, str) else ",".join(allowed)
    args = [job_id, cell, state, allowed_arg, reason[:500], f"{time.time():.3f}", new_tokens, generations, keys.RECENT]
    run = script(conn, _TRANSITION)
    out = run(keys=[k["state"], k["counts"], k["failures"], k["meta"], k["recent"]], args=args, client=pipeline)
    if pipeline is not None:
        return None
    applied, old = out
    return bool(applied), old.decode() if isinstance(old, bytes) else old


def transition_many(conn, tenant: str, sweep_id: str, items, state: str, *, pipeline=None):
    """Bulk `transition` (no reasons, no meta): items are (job id, cell, allowed states)."""
    k = keys.sweep_keys(tenant, sweep_id)
    args: list[str] = [state]
    for job_id, cell, allowed in items:
        args += [job_id, cell, allowed if isinstance(allowed, str) else ",".join(allowed)]
    return script(conn, _TRANSITION_MANY)(keys=[k["state"], k["counts"], k["failures"]], args=args, client=pipeline)


# -- errors ---------------------------------------------------------------------------------

class Interrupted(BaseException):
    """Raised inside a running job by its worker (not by the job): shutdown or cancel.

    A BaseException so that no `except Exception` in the job swallows it.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why  # "shutdown": requeue the job; "cancel": the sweep was cancelled


def first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else ""


def classify(err: BaseException) -> tuple[bool, str]:
    """(permanent, reason): a permanent error fails the job at once, without retries."""
    from pydantic import ValidationError
    from rq.timeouts import JobTimeoutException

    if isinstance(err, (PermanentJobError, UsageError)):
        return True, first_line(str(err)) or type(err).__name__
    if isinstance(err, ValidationError):
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"]) or "job"
        return True, f"invalid job: {where}: {e['msg']}"
    if isinstance(err, JobTimeoutException):
        return True, f"job timed out ({first_line(str(err))}); raise job_timeout_s in the sweep spec"
    if isinstance(err, DecodebenchError):
        return False, first_line(str(err)) or type(err).__name__
    return False, f"{type(err).__name__}: {first_line(str(err))}".rstrip(": ")


# -- the function RQ calls ------------------------------------------------------------------

_active = threading.Event()  # set while a job's own code runs: the only time it may be interrupted
_stores: dict[str, Any] = {}


def job_is_interruptible() -> bool:
    return _active.is_set()


def _store():
    from worker.store import open_store

    url = os.environ.get("DECODEBENCH_STORE") or ""
    if url not in _stores:
        _stores[url] = open_store(url or None)
    return _stores[url]


def execute(job: dict) -> dict[str, Any]:
    """Run one job for RQ (a JobSpec as a JSON dict) and keep the sweep's counters."""
    from rq import get_current_job

    from worker.contract import JobSpec

    rq_job = get_current_job()
    conn = rq_job.connection if rq_job is not None else None
    try:
        spec = JobSpec.model_validate(job)
    except Exception as err:
        if rq_job is not None:
            rq_job.retries_left = 0
        raise PermanentJobError(classify(err)[1]) from None
    ids = (spec.tenant, spec.sweep_id, spec.job_id, spec.cell)
    if conn is not None:
        applied, old = transition(conn, *ids, "running", allowed=("none", "queued", "running", "failed"))
        if not applied and old != "running":
            log.info("job.not_run", job_id=spec.job_id, state=old)
            return {"job_id": spec.job_id, "status": "skipped" if old == "done" else old}
    from worker.job import run_job

    try:
        _active.set()
        out = run_job(job, store=_store())
        _active.clear()
    except Interrupted as err:
        _active.clear()
        if conn is not None:
            state = "queued" if err.why == "shutdown" else "cancelled"
            transition(conn, *ids, state, allowed=("running",))
        raise
    except BaseException as err:
        _active.clear()
        if conn is None:
            raise
        permanent, reason = classify(err)
        retry = not permanent and bool(rq_job.retries_left and rq_job.retries_left > 0)
        if permanent:
            rq_job.retries_left = 0
        rq_job.meta["reason"] = reason
        rq_job.save_meta()
        transition(conn, *ids, "queued" if retry else "failed", allowed=("running",), reason=reason)
        log.warning("job.failed", job_id=spec.job_id, reason=reason, retry=retry, permanent=permanent)
        raise
    if conn is not None:
        transition(conn, *ids, "done", new_tokens=int(out.get("new_tokens", 0) or 0),
                   generations=len(spec.prompts))
    return out


# -- lost jobs ------------------------------------------------------------------------------

def heartbeat_job(conn, tenant: str, sweep_id: str, job_id: str, cell: str, ttl: float, *, create: bool = False) -> None:
    """Push the job's deadline in `decodebench:<t>:running` (create: when the job starts)."""
    member = keys.running_member(sweep_id, job_id, cell)
    conn.zadd(keys.running(tenant), {member: time.time() + ttl}, xx=not create)


def forget_job(conn, tenant: str, sweep_id: str, job_id: str, cell: str) -> None:
    conn.zrem(keys.running(tenant), keys.running_member(sweep_id, job_id, cell))


def _drop_started(conn, queue_name: str, job_id: str) -> None:
    """Remove the dead execution from RQ's started registry so RQ does not handle it twice."""
    from rq.registry import StartedJobRegistry

    registry = StartedJobRegistry(queue_name, connection=conn)
    stale = [m for m in conn.zrange(registry.key, 0, -1) if m.decode().split(":")[0] == job_id]
    if stale:
        conn.zrem(registry.key, *stale)


def reap(conn, tenants, timing: Timing | None = None) -> list[str]:
    """Requeue every job of `tenants` whose worker stopped heartbeating; return their ids."""
    from rq import Queue
    from rq.exceptions import NoSuchJobError
    from rq.job import Job, JobStatus
    from rq.job_lifecycle import record_job_failure
    from rq.serializers import JSONSerializer

    timing = timing or Timing.from_env()
    reaped = []
    for tenant in tenants:
        reaped += _reap_taken_not_started(conn, tenant, timing)
        zkey = keys.running(tenant)
        for raw in conn.zrangebyscore(zkey, 0, time.time()):
            if not conn.zrem(zkey, raw):  # another reaper took it
                continue
            sweep_id, job_id, cell = keys.split_running_member(raw.decode())
            ids = (tenant, sweep_id, job_id, cell)
            try:
                job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
            except NoSuchJobError:
                transition(conn, *ids, "failed", allowed=("running",),
                           reason="lost with its worker, and its RQ job is gone: resubmit with --retry-failed")
                continue
            status = job.get_status()
            losses = conn.hincrby(keys.lost(tenant), job_id, 1)
            conn.hincrby(keys.sweep(tenant, sweep_id, "meta"), "lost", 1)
            log.warning("job.lost", job_id=job_id, sweep_id=sweep_id, rq_status=str(status), times=losses)
            if status in (JobStatus.QUEUED, JobStatus.SCHEDULED):  # RQ's own cleanup requeued it
                transition(conn, *ids, "queued", allowed=("running",))
            elif status == JobStatus.FINISHED:
                transition(conn, *ids, "done", allowed=("running",))
            elif status in (JobStatus.STOPPED, JobStatus.CANCELED):
                transition(conn, *ids, "cancelled", allowed=("running",))
            elif losses > timing.max_lost:
                reason = (f"lost {losses} times: its worker died or stopped heartbeating while running it "
                          "(killed? out of memory?)")
                _drop_started(conn, job.origin, job_id)
                with conn.pipeline() as pipe:
                    record_job_failure(job, reason, pipe)
                    pipe.execute()
                transition(conn, *ids, "failed", allowed=("running",), reason=reason)
            else:
                _drop_started(conn, job.origin, job_id)
                if status == JobStatus.FAILED:  # RQ's cleanup failed it as abandoned: undo
                    job.failed_job_registry.remove(job)
                queue = Queue(job.origin, connection=conn, serializer=JSONSerializer)
                queue.enqueue_job(job, at_front=True)
                transition(conn, *ids, "queued", allowed=("running",))
                reaped.append(job_id)
    return reaped


def _reap_taken_not_started(conn, tenant: str, timing: Timing) -> list[str]:
    """Jobs left in RQ's intermediate lists by a worker that died between taking and starting them."""
    from rq import Queue
    from rq.intermediate_queue import IntermediateQueue
    from rq.job import JobStatus
    from rq.serializers import JSONSerializer

    out = []
    for name in keys.tenant_queues(tenant):
        queue = Queue(name, connection=conn, serializer=JSONSerializer)
        pending = IntermediateQueue(queue.key, conn)
        for job_id in pending.get_job_ids():
            job = queue.fetch_job(job_id)
            if job is None:
                pending.remove(job_id)
                continue
            if job.get_status() != JobStatus.QUEUED or pending.set_first_seen(job_id):
                continue
            first = pending.get_first_seen(job_id)
            if first is None or time.time() - first.timestamp() < timing.heartbeat_ttl:
                continue
            if conn.lrem(pending.key, 1, job_id):  # we own it now
                queue.enqueue_job(job, at_front=True)
                conn.delete(pending.get_first_seen_key(job_id))
                log.warning("job.lost_before_start", job_id=job_id, queue=name)
                out.append(job_id)
    return out


def enqueue_due_retries(conn, queue_names: list[str]) -> None:
    """Move retries whose backoff has elapsed from RQ's scheduled registries to their queues."""
    from rq.scheduler import RQScheduler
    from rq.serializers import JSONSerializer

    if not queue_names:
        return
    scheduler = RQScheduler(queue_names, connection=conn, serializer=JSONSerializer, logging_level="WARNING")
    try:
        if scheduler.acquire_locks():
            scheduler.enqueue_scheduled_jobs()
    finally:
        scheduler.release_locks()
