"""The RQ adapter of the controller: submit, status, cancel, retry, and the job -> sweep index.

Jobs are genuine RQ jobs on queues `decodebench.<tenant>.<priority>`, serialised as
JSON, calling `worker.queueing.execute(job_spec_dict)`. decodebench's own counters
(`worker.keys`) are what `status` reads: a few hash reads, whatever the sweep's size.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass, field

from worker import keys
from worker.contract import JobSpec
from worker.errors import ServiceError, UsageError
from worker.queueing import FUNC, script, transition_many

CHUNK = 5000
RESULT_TTL = 24 * 3600  # RQ keeps a finished job (and its JSON spec) a day; results live in the store
FAILURE_TTL = 7 * 24 * 3600  # failed jobs stay inspectable (and retryable from RQ) for a week
DEFAULT_RETRY_INTERVALS = (30, 120, 600)  # seconds before the 1st, 2nd, 3rd retry of a transient failure


def connect(url: str):
    """A Redis client for `url`; ServiceError (one line, no password) if unreachable."""
    import redis

    conn = redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    try:
        conn.ping()
    except redis.RedisError as err:
        from worker.cli import _safe_url

        raise ServiceError(f"Redis at {_safe_url(url)} is not reachable: {err}") from None
    return conn


def retry_policy(retries: int | None = None):
    """RQ Retry with backoff (env DECODEBENCH_RETRY_INTERVALS, e.g. "30,120,600")."""
    from rq import Retry

    raw = os.environ.get("DECODEBENCH_RETRY_INTERVALS")
    intervals = [int(x) for x in raw.split(",")] if raw else list(DEFAULT_RETRY_INTERVALS)
    count = len(intervals) if retries is None else retries
    return Retry(max=count, interval=intervals) if count > 0 else None


def job_timeout(job: JobSpec) -> int:
    """The job's own timeout, capped by the cluster's DECODEBENCH_JOB_TIMEOUT when set."""
    cap = os.environ.get("DECODEBENCH_JOB_TIMEOUT")
    return min(job.timeout_s, int(cap)) if cap else job.timeout_s


# -- submit ---------------------------------------------------------------------------------

@dataclass
class SubmitOutcome:
    sweep_id: str
    queue: str
    jobs: int
    enqueued: list[str] = field(default_factory=list)
    done: int = 0
    pending: int = 0  # already queued or running
    failed: int = 0  # failed or cancelled, not retried
    new: bool = True
    cancelled: bool = False


def _rq_jobs_exist(conn, job_ids: list[str]) -> list[bool]:
    from rq.job import Job

    out: list[bool] = []
    for i in range(0, len(job_ids), CHUNK):
        with conn.pipeline(transaction=False) as pipe:
            for job_id in job_ids[i : i + CHUNK]:
                pipe.exists(Job.key_for(job_id))
            out += [bool(x) for x in pipe.execute()]
    return out


def enqueue_jobs(conn, jobs: list[JobSpec], tenant: str, priority: str = "normal", *, retry_failed: bool = False,
                 retries: int | None = None, name: str = "") -> SubmitOutcome:
    """Record the sweep in Redis and enqueue the jobs that are missing (or failed, with retry_failed).

    Idempotent: a job that is done, queued or running is not enqueued again.
    """
    from rq import Queue
    from rq.job import Job
    from rq.serializers import JSONSerializer

    sweep_id = jobs[0].sweep_id
    qname = keys.queue_name(tenant, priority)
    k = keys.sweep_keys(tenant, sweep_id)
    out = SubmitOutcome(sweep_id, qname, len(jobs))
    meta = {key.decode(): v.decode() for key, v in conn.hgetall(k["meta"]).items()}
    out.new = not meta
    out.cancelled = bool(meta.get("cancelled"))
    ids = [j.job_id for j in jobs]
    states: list[str | None] = []
    for i in range(0, len(ids), CHUNK):
        states += [s.decode() if s else None for s in conn.hmget(k["state"], ids[i : i + CHUNK])]
    pending = [i for i, s in enumerate(states) if s in ("queued", "running")]
    exists = dict(zip(pending, _rq_jobs_exist(conn, [ids[i] for i in pending])))
    todo: list[tuple[JobSpec, str]] = []
    for i, (job, state) in enumerate(zip(jobs, states)):
        if state is None:
            todo.append((job, "none"))
        elif state == "done":
            out.done += 1
        elif state in ("queued", "running"):
            if exists[i]:
                out.pending += 1
            else:  # its RQ job vanished (Redis lost data): enqueue it again
                todo.append((job, state))
        elif retry_failed:
            todo.append((job, state))
        else:
            out.failed += 1
    if out.cancelled and not retry_failed:
        return out  # a cancelled sweep resumes only on purpose
    retry_from = [j.job_id for j, s in todo if s in ("failed", "cancelled")]
    stale = [j for j in Job.fetch_many(retry_from, connection=conn, serializer=JSONSerializer) if j is not None]
    queue = Queue(qname, connection=conn, serializer=JSONSerializer)
    policy = retry_policy(retries)
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    with conn.pipeline(transaction=False) as pipe:
        pipe.hsetnx(k["meta"], "created_at", now)
        pipe.hset(k["meta"], mapping={"name": name or jobs[0].sweep_name, "tenant": tenant, "n_jobs": len(jobs),
                                     "queue": qname, "cells": len({j.cell for j in jobs})})
        if todo:
            pipe.hdel(k["meta"], "cancelled", "finished_at")
        pipe.zadd(keys.sweeps(tenant), {sweep_id: time.time()}, nx=True)
        for i in range(0, len(jobs), CHUNK):
            pipe.hset(k["cells"], mapping={j.job_id: j.cell for j in jobs[i : i + CHUNK]})
        for job in stale:
            job.delete(pipeline=pipe)
        if retry_from:
            pipe.hdel(keys.lost(tenant), *retry_from)
        pipe.execute()
    template = rq_template(queue, policy)
    for i in range(0, len(todo), CHUNK):
        part = todo[i : i + CHUNK]
        with conn.pipeline(transaction=False) as pipe:
            transition_many(conn, tenant, sweep_id, [(j.job_id, j.cell, s) for j, s in part], "queued", pipeline=pipe)
            bulk_enqueue(conn, queue, template, [job for job, _ in part], pipeline=pipe)
            pipe.execute()
        out.enqueued += [job.job_id for job, _ in part]
    expire(conn, tenant, sweep_id)
    return out


def sweep_ttl_s() -> int:
    return int(float(os.environ.get("DECODEBENCH_SWEEP_TTL_DAYS", keys.SWEEP_TTL_DAYS)) * 86400)


def expire(conn, tenant: str, sweep_id: str) -> None:
    """A sweep's Redis keys live SWEEP_TTL_DAYS after its last submit or retry."""
    ttl = sweep_ttl_s()
    with conn.pipeline(transaction=False) as pipe:
        for key in keys.sweep_keys(tenant, sweep_id).values():
            pipe.expire(key, ttl)
        pipe.execute()


# RQ's own enqueue_many builds a Job object per job (~0.5 ms of CPU each): too slow for
# 100,000 jobs. bulk_enqueue writes the very hashes RQ would: the fields common to all jobs
# come from RQ's Job.to_dict() of a template job, the per-job ones (data, description, meta,
# timeout) are serialised as Job.to_dict() does, and one Lua call per chunk stores them and
# pushes the ids. tests/test_queue.py checks the result against RQ's enqueue_many.
_BULK_ENQUEUE = """
local n = tonumber(ARGV[1])
local template = {}
for i = 2, 2 * n + 1 do template[#template + 1] = ARGV[i] end
local ids = {}
for i = 2 * n + 2, #ARGV, 6 do
  local key = ARGV[i]
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(template))
  redis.call('HSET', key, 'data', ARGV[i + 2], 'description', ARGV[i + 3], 'meta', ARGV[i + 4], 'timeout', ARGV[i + 5])
  ids[#ids + 1] = ARGV[i + 1]
  if #ids == 1000 then
    redis.call('RPUSH', KEYS[1], unpack(ids))
    ids = {}
  end
end
if #ids > 0 then redis.call('RPUSH', KEYS[1], unpack(ids)) end
redis.call('SADD', KEYS[2], KEYS[1])
return 1
"""
PER_JOB_FIELDS = ("data", "description", "meta", "timeout")


def rq_template(queue, policy) -> dict:
    """The fields RQ writes for every queued job of this queue, from RQ's own Job.to_dict()."""
    from rq.utils import now

    job = queue.create_job(FUNC, args=(), job_id="template", timeout=1, result_ttl=RESULT_TTL,
                           failure_ttl=FAILURE_TTL, retry=policy)
    job.enqueued_at = now()  # as Queue._prepare_for_queue does
    fields = job.to_dict()
    return {k: v for k, v in fields.items() if k not in PER_JOB_FIELDS}


def rq_job_fields(job: JobSpec) -> tuple[bytes, str, bytes, int]:
    """(data, description, meta, timeout) of one job, serialised as RQ's JSONSerializer and to_dict do."""
    import json
    import zlib

    data = b'["' + FUNC.encode() + b'", null, [' + job.model_dump_json().encode() + b"], {}]"
    meta = json.dumps({"tenant": job.tenant, "sweep_id": job.sweep_id, "cell": job.cell}).encode()
    description = f"decodebench {job.cell} seed={job.seed} shard={job.shard + 1}/{job.n_shards}"
    return zlib.compress(data, 1), description, meta, job_timeout(job)


def bulk_enqueue(conn, queue, template: dict, jobs: list[JobSpec], *, pipeline) -> None:
    from rq.job import Job

    args: list = [len(template)]
    for k, v in template.items():
        args += [k, v]
    for job in jobs:
        args += [Job.key_for(job.job_id), job.job_id, *rq_job_fields(job)]
    script(conn, _BULK_ENQUEUE)(keys=[queue.key, queue.redis_queues_keys], args=args, client=pipeline)


def submit(conn, store, spec, tenant: str, priority: str = "normal", *, retry_failed: bool = False,
           retries: int | None = None) -> SubmitOutcome:
    """Plan the sweep, store its spec and plan (once), enqueue its jobs grouped by model."""
    from controller.local import save_sweep
    from controller.plan import plan

    jobs = plan(spec, tenant)
    save_sweep(store, spec, jobs, tenant, mode="distributed")
    return enqueue_jobs(conn, jobs, tenant, priority, retry_failed=retry_failed, retries=retries, name=spec.name)


def retry(conn, store, tenant: str, sweep_id: str, priority: str = "normal", retries: int | None = None) -> SubmitOutcome:
    """Enqueue the failed and cancelled jobs of a submitted sweep again (from its stored spec)."""
    from controller.plan import plan
    from controller.spec import stored_spec

    spec = stored_spec(store.load_spec(tenant, sweep_id), f"stored spec of sweep {sweep_id}")
    jobs = plan(spec, tenant)
    if jobs[0].sweep_id != sweep_id:
        raise UsageError(f"sweep {sweep_id}: its prompts changed since it was submitted (now {jobs[0].sweep_id}); submit it again")
    return enqueue_jobs(conn, jobs, tenant, priority, retry_failed=True, retries=retries, name=spec.name)


# -- resolve, status ------------------------------------------------------------------------

def resolve_sweep(conn, tenant: str, sweep: str) -> str:
    """A submitted sweep id, or a unique prefix of one."""
    members = [m.decode() for m in conn.zrange(keys.sweeps(tenant), 0, -1)]
    with conn.pipeline(transaction=False) as pipe:
        for m in members:
            pipe.exists(keys.sweep(tenant, m, "meta"))
        alive = pipe.execute()
    expired = [m for m, ok in zip(members, alive) if not ok]
    if expired:  # their keys reached SWEEP_TTL_DAYS
        conn.zrem(keys.sweeps(tenant), *expired)
    members = [m for m, ok in zip(members, alive) if ok]
    if sweep in members:
        return sweep
    matches = [m for m in members if m.startswith(sweep)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise UsageError(f"sweep prefix {sweep!r} is ambiguous: {', '.join(matches[:5])}")
    raise UsageError(f"no submitted sweep {sweep!r} for tenant {tenant!r} (see `decodebench submit`)")


@dataclass
class SweepStatus:
    tenant: str
    sweep_id: str
    name: str
    queue: str
    n_jobs: int
    cells: dict[str, dict[str, int]]
    failures: list[tuple[str, str, str]]  # (job id, cell, reason), at most `max_failures`
    n_failures: int
    started_at: float | None
    last_done_at: float | None
    new_tokens: int
    generations: int
    recent: list[float]
    cancelled: bool
    lost: int = 0  # times a job was requeued because its worker died

    def total(self, state: str) -> int:
        return sum(c.get(state, 0) for c in self.cells.values())

    @property
    def complete(self) -> bool:
        return self.total("queued") + self.total("running") == 0

    @property
    def jobs_per_s(self) -> float | None:
        """Recent throughput: over the last finished jobs, else since the first start."""
        if len(self.recent) >= 2 and self.recent[0] > self.recent[-1]:
            return (len(self.recent) - 1) / (self.recent[0] - self.recent[-1])
        if self.recent and self.started_at and self.recent[0] > self.started_at:
            return len(self.recent) / (self.recent[0] - self.started_at)
        return None

    @property
    def tokens_per_s(self) -> float | None:
        if self.started_at and self.last_done_at and self.last_done_at > self.started_at:
            return self.new_tokens / (self.last_done_at - self.started_at)
        return None

    @property
    def eta_s(self) -> float | None:
        left = self.total("queued") + self.total("running")
        rate = self.jobs_per_s
        return left / rate if rate and left else (0.0 if not left else None)


def sweep_status(conn, tenant: str, sweep_id: str, *, max_failures: int = 20, reap_first: bool = True) -> SweepStatus:
    """The sweep's counters: O(cells + max_failures) Redis reads, one round trip."""
    from worker.queueing import reap

    if reap_first:
        reap(conn, [tenant])  # a sweep whose workers all died still moves on
    k = keys.sweep_keys(tenant, sweep_id)
    with conn.pipeline(transaction=False) as pipe:
        pipe.hgetall(k["meta"])
        pipe.hgetall(k["counts"])
        pipe.hlen(k["failures"])
        pipe.hscan(k["failures"], 0, count=max_failures)
        pipe.lrange(k["recent"], 0, -1)
        meta_raw, counts_raw, n_failures, (_, failures_raw), recent = pipe.execute()
    if not meta_raw:
        raise UsageError(f"no submitted sweep {sweep_id!r} for tenant {tenant!r}")
    meta = {a.decode(): b.decode() for a, b in meta_raw.items()}
    cells: dict[str, dict[str, int]] = {}
    for f, n in counts_raw.items():
        cell, state = keys.split_count_field(f.decode())
        if int(n):
            cells.setdefault(cell, {})[state] = int(n)
    failure_ids = [j.decode() for j in list(failures_raw)[:max_failures]]
    failure_cells = conn.hmget(k["cells"], failure_ids) if failure_ids else []
    failures = [(j, (c or b"").decode(), failures_raw[j.encode()].decode()) for j, c in zip(failure_ids, failure_cells)]

    def num(name: str) -> float | None:
        return float(meta[name]) if meta.get(name) else None

    return SweepStatus(
        tenant=tenant, sweep_id=sweep_id, name=meta.get("name", ""), queue=meta.get("queue", ""),
        n_jobs=int(meta.get("n_jobs", 0)), cells=dict(sorted(cells.items())), failures=sorted(failures, key=lambda f: f[1]),
        n_failures=n_failures, started_at=num("started_at"), last_done_at=num("last_done_at"),
        new_tokens=int(meta.get("new_tokens", 0)), generations=int(meta.get("generations", 0)),
        recent=[float(x) for x in recent], cancelled=bool(meta.get("cancelled")), lost=int(meta.get("lost", 0)),
    )


# -- cancel ---------------------------------------------------------------------------------

_CANCEL_QUEUED = """
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i + 1] == 'queued' then
    local cell = redis.call('HGET', KEYS[3], all[i]) or '?'
    redis.call('HSET', KEYS[1], all[i], 'cancelled')
    redis.call('HINCRBY', KEYS[2], cell .. '|queued', -1)
    redis.call('HINCRBY', KEYS[2], cell .. '|cancelled', 1)
    table.insert(out, all[i])
  end
end
return out
"""

_DROP_FROM_QUEUE = """
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
local keep = {}
local dropped = 0
for _, id in ipairs(ids) do
  if redis.call('HGET', KEYS[2], id) == 'cancelled' then dropped = dropped + 1 else table.insert(keep, id) end
end
if dropped > 0 then
  redis.call('DEL', KEYS[1])
  for i = 1, #keep, 5000 do
    redis.call('RPUSH', KEYS[1], unpack(keep, i, math.min(i + 4999, #keep)))
  end
end
return dropped
"""


@dataclass
class CancelOutcome:
    cancelled: int
    stopping: list[str]


def cancel(conn, tenant: str, sweep_id: str) -> CancelOutcome:
    """Stop the sweep's queued jobs (removed from the queues) and ask running ones to stop."""
    from rq import Queue
    from rq.command import send_stop_job_command
    from rq.job import Job, JobStatus
    from rq.registry import CanceledJobRegistry
    from rq.serializers import JSONSerializer

    k = keys.sweep_keys(tenant, sweep_id)
    conn.hset(k["meta"], "cancelled", f"{time.time():.3f}")
    ids = [i.decode() for i in script(conn, _CANCEL_QUEUED)(keys=[k["state"], k["counts"], k["cells"]])]
    for priority in keys.PRIORITIES:
        queue = Queue(keys.queue_name(tenant, priority), connection=conn, serializer=JSONSerializer)
        script(conn, _DROP_FROM_QUEUE)(keys=[queue.key, k["state"]])
    qname = (conn.hget(k["meta"], "queue") or keys.queue_name(tenant).encode()).decode()
    registry = CanceledJobRegistry(qname, connection=conn)
    expires = time.time() + FAILURE_TTL  # as CanceledJobRegistry.add scores its entries
    for i in range(0, len(ids), CHUNK):
        part = ids[i : i + CHUNK]
        with conn.pipeline(transaction=False) as pipe:
            for job_id in part:
                pipe.hset(Job.key_for(job_id), "status", JobStatus.CANCELED.value)
            pipe.zadd(registry.key, {job_id: expires for job_id in part})
            pipe.execute()
    stopping = []
    for raw in conn.zrange(keys.running(tenant), 0, -1):
        s, job_id, _cell = keys.split_running_member(raw.decode())
        if s == sweep_id:
            try:
                send_stop_job_command(conn, job_id, serializer=JSONSerializer)
            except Exception:  # not executing any more; the worker also checks the flag
                pass
            stopping.append(job_id)
    return CancelOutcome(len(ids), stopping)


def job_sweep(conn, tenant: str, job_id: str) -> str | None:
    """The submitted sweep of tenant that holds `job_id` (one pipelined HEXISTS per sweep)."""
    sweeps = [m.decode() for m in conn.zrange(keys.sweeps(tenant), 0, -1)]
    with conn.pipeline(transaction=False) as pipe:
        for sweep_id in sweeps:
            pipe.hexists(keys.sweep(tenant, sweep_id, "cells"), job_id)
        found = pipe.execute()
    return next((s for s, hit in zip(sweeps, found) if hit), None)


def job_state(conn, tenant: str, sweep_id: str, job_id: str) -> str | None:
    state = conn.hget(keys.sweep(tenant, sweep_id, "state"), job_id)
    return state.decode() if state else None
