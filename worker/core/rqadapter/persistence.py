"""RQ's API and persistence as decodebench's controller, sweep state and worker task use them:
job classes and queues per tenant, the job hashes submit writes in bulk, registries, lost jobs
and due retries, commands, and what a running job asks of RQ (rq 3.0.0, `RQ_VERSION`)."""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from redis.commands.core import Script
from redis.exceptions import WatchError
from rq import Queue, Retry, Worker, get_current_job
from rq.command import send_command
from rq.exceptions import DeserializationError as DeserializationError  # re-exported: a payload RQ cannot read
from rq.exceptions import NoSuchJobError
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.job import JobStatus as Status  # RQ's job statuses, for the worker's modules too
from rq.job_lifecycle import record_job_failure
from rq.registry import ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.utils import current_timestamp, now

from worker.core import keys

RQ_VERSION = "3.0.0"
SERIALIZER = JSONSerializer  # jobs are JSON, never pickle


# -- job classes and queues ---------------------------------------------------------------------


@functools.cache
def tenant_job_class(tenant: str) -> type[Job]:
    """RQ's Job with the tenant's key prefix: every job hash RQ reads or writes for it (and its
    dependents/dependencies keys) lives under `rq:job:<tenant>:`."""
    return type(f"TenantJob_{tenant}", (Job,), {"redis_job_namespace_prefix": keys.rq_job_prefix(tenant)})


def tenant_queue(conn, name: str, tenant: str) -> Queue:
    """The RQ queue `name` of a tenant, its jobs serialised as JSON under the tenant's prefix."""
    return Queue(name, connection=conn, serializer=SERIALIZER, job_class=tenant_job_class(tenant))


def retry(count: int, intervals: list[int]) -> Retry | None:
    """RQ's retry policy: `count` retries after `intervals` seconds (None: no retry)."""
    return Retry(max=count, interval=intervals) if count > 0 else None


# -- job hashes written in bulk (submit) ---------------------------------------------------------

# RQ's own enqueue_many builds a Job object per job (~0.5 ms of CPU each): too slow for 100,000
# jobs. `bulk_enqueue` writes the very hashes RQ would: the fields common to all jobs come from
# RQ's Job.to_dict() of a template job (`job_template`), the per-job ones are serialised as
# Job.to_dict() does (`call_data`), and one Lua call per chunk stores them, with decodebench's
# extra fields, and pushes the ids. tests/unit/controller/launch/test_queue.py checks the result against enqueue_many.
_BULK_ENQUEUE = """
local n = tonumber(ARGV[1])
local per = tonumber(ARGV[2])
local template = {}
for i = 3, 2 * n + 2 do template[#template + 1] = ARGV[i] end
local names = {}
for i = 2 * n + 3, 2 * n + 2 + per do names[#names + 1] = ARGV[i] end
local ids = {}
for i = 2 * n + 3 + per, #ARGV, per + 2 do
  local key = ARGV[i]
  local fields = {}
  for j = 1, per do
    fields[#fields + 1] = names[j]
    fields[#fields + 1] = ARGV[i + 1 + j]
  end
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(template))
  redis.call('HSET', key, unpack(fields))
  ids[#ids + 1] = ARGV[i + 1]
  if #ids == 1000 then
    redis.call('RPUSH', KEYS[1], unpack(ids))
    ids = {}
  end
end
if #ids > 0 then redis.call('RPUSH', KEYS[1], unpack(ids)) end
return 1
"""
PER_JOB_FIELDS = ("data", "description", "meta", "timeout")  # what differs between a queue's jobs
_scripts: dict[str, Script] = {}


def job_template(queue: Queue, function: str, policy: Retry | None, result_ttl: int, failure_ttl: int) -> dict:
    """The fields RQ writes for every queued job of this queue calling `function`, from its Job.to_dict()."""
    job = queue.create_job(
        function,
        args=(),
        job_id="template",
        timeout=1,
        result_ttl=result_ttl,
        failure_ttl=failure_ttl,
        retry=policy,
    )
    job.enqueued_at = now()  # as Queue._prepare_for_queue does
    fields = job.to_dict()
    return {k: v for k, v in fields.items() if k not in PER_JOB_FIELDS}


def call_data(function: str, arg_json: bytes) -> bytes:
    """A job's `data` as RQ's JSONSerializer writes the call (function, instance, args, kwargs),
    uncompressed: one positional argument, already JSON."""
    return b'["' + function.encode() + b'", null, [' + arg_json + b"], {}]"


def meta_field(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta).encode()


def bulk_enqueue(client, queue: Queue, template: dict, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    """Write each (job id, per-job fields: PER_JOB_FIELDS and any extra) as RQ's job hash on top of
    `template` and push the ids onto the queue (one Lua call); the queue joins RQ's queue set by a
    plain SADD (a tenant's Redis user may only SADD that set)."""
    if not jobs:
        return
    names = list(jobs[0][1])
    args: list = [len(template), len(names)]
    for k, v in template.items():
        args += [k, v]
    args += names
    for job_id, fields in jobs:
        args += [queue.job_class.key_for(job_id), job_id, *(fields[n] for n in names)]
    script = _scripts.get("bulk")
    if script is None:
        script = _scripts["bulk"] = Script(client, _BULK_ENQUEUE)  # the client only encodes the source here
    script(keys=[queue.key], args=args, client=client)
    client.sadd(queue.redis_queues_keys, queue.key)


def jobs_exist(conn, tenant: str, job_ids: list[str]) -> list[bool]:
    """Whether each job's RQ hash exists (one round trip)."""
    with conn.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.exists(keys.rq_job_key(tenant, job_id))
        return [bool(x) for x in pipe.execute()]


def job_statuses(conn, tenant: str, job_ids: list[str]) -> list[str | None]:
    """Each job's RQ status (None where its hash is gone), one round trip."""
    with conn.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(keys.rq_job_key(tenant, job_id), "status")
        return [s.decode(errors="replace") if s else None for s in pipe.execute()]


# -- lost jobs and due retries (the reaper) -------------------------------------------------------


def queue_of(conn, name: str, job_class: type[Job]) -> Queue:
    return Queue(name, connection=conn, serializer=SERIALIZER, job_class=job_class)


def fetch(conn, job_class: type[Job], job_id: str) -> Job | None:
    """The job, or None where its hash is gone."""
    try:
        return job_class.fetch(job_id, connection=conn, serializer=SERIALIZER)
    except NoSuchJobError:
        return None


def drop_started(conn, queue_name: str, job_id: str) -> None:
    """Remove a dead execution from RQ's started registry so RQ does not handle it twice."""
    registry = StartedJobRegistry(queue_name, connection=conn)
    stale = [m for m in conn.zrange(registry.key, 0, -1) if m.decode().split(":")[0] == job_id]
    if stale:
        conn.zrem(registry.key, *stale)


def fail(conn, job: Job, reason: str) -> None:
    """The job failed in RQ's books (its failed registry, status and reason), as RQ fails a job."""
    with conn.pipeline() as pipe:
        record_job_failure(job, reason, pipe)
        pipe.execute()


def requeue_front(conn, job: Job, *, failed: bool) -> None:
    """The job back at the front of its queue; `failed`: out of the failed registry, where RQ's
    cleanup put it as abandoned."""
    if failed:
        job.failed_job_registry.remove(job)
    queue_of(conn, job.origin, type(job)).enqueue_job(job, at_front=True)


def requeue_taken_not_started(conn, queue: Queue, grace_s: float, drop: Callable[[str], None]) -> list[str]:
    """Jobs in the queue's intermediate list (taken by a worker, never started) for `grace_s` and more
    since first seen there: back to the front of the queue (after `drop(job_id)`); their ids."""
    pending = IntermediateQueue(queue.key, conn)
    out = []
    for job_id in pending.get_job_ids():
        job = queue.fetch_job(job_id)
        if job is None:
            pending.remove(job_id)
            continue
        if job.get_status() != Status.QUEUED or pending.set_first_seen(job_id):
            continue
        first = pending.get_first_seen(job_id)
        if first is None or time.time() - first.timestamp() < grace_s:
            continue
        if conn.lrem(pending.key, 1, job_id):  # we own it now
            drop(job_id)
            queue.enqueue_job(job, at_front=True)
            conn.delete(pending.get_first_seen_key(job_id))
            out.append(job_id)
    return out


def enqueue_due_retries(conn, queue: Queue) -> None:
    """Move the queue's retries whose backoff has elapsed from its scheduled registry to it.

    As RQScheduler.enqueue_scheduled_jobs, with the queue's own (per-tenant) job class, which RQ's
    scheduler does not take. Each move is one transaction that WATCHes the registry, so two workers
    never both enqueue a job and a dying worker never drops one."""
    registry = ScheduledJobRegistry(queue=queue)
    for job_id in registry.get_jobs_to_schedule(current_timestamp()):
        job = queue.fetch_job(job_id)
        if job is None:
            conn.zrem(registry.key, job_id)
            continue
        with conn.pipeline() as pipe, contextlib.suppress(WatchError):
            pipe.watch(registry.key)
            if pipe.zscore(registry.key, job_id) is None:
                continue  # another worker moved it
            pipe.multi()
            queue._enqueue_job(job, pipeline=pipe, at_front=job.should_enqueue_at_front())
            pipe.zrem(registry.key, job_id)
            pipe.execute()


# -- registries and commands ---------------------------------------------------------------------


def drop_from_registries(pipe, queue_names: list[str], job_ids: list[str], kinds=("failed", "canceled")) -> None:
    """The jobs leave these registries of the queues. Not RQ's Job.delete: that also deletes the
    worker's execution and result keys, which a tenant's Redis user may not touch."""
    for qname in queue_names:
        for kind in kinds:
            pipe.zrem(keys.rq_registry_key(kind, qname), *job_ids)


def job_origins(conn, tenant: str, job_ids: list[str]) -> list[str]:
    """The queue each job's hash names as its origin ('' where it has none)."""
    with conn.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(keys.rq_job_key(tenant, job_id), "origin")
        return [(o or b"").decode(errors="replace") for o in pipe.execute()]


def mark_canceled(pipe, tenant: str, queue_name: str, job_ids: list[str], ttl: int, at: float) -> None:
    """The jobs' hashes say canceled and they sit in the queue's canceled registry, scored as
    CanceledJobRegistry.add scores its entries (their expiry). A cancelled job's payload is dropped
    at once (a retry re-plans it from the stored spec and writes the hash afresh) and its hash expires
    with its registry entry: what a cancel leaves in Redis is a few hundred bytes, for `ttl` at most."""
    for job_id in job_ids:
        key = keys.rq_job_key(tenant, job_id)
        pipe.hset(key, "status", Status.CANCELED.value)
        pipe.hdel(key, "data")
        pipe.expire(key, ttl)
    pipe.zadd(keys.rq_registry_key("canceled", queue_name), {job_id: at + ttl for job_id in job_ids})


def cancel_lost(conn, tenant: str, job: Job, ttl: int, at: float) -> None:
    """A lost job of a cancelled sweep out of its queue and of RQ's started, scheduled and failed registries
    (wherever RQ's own cleanup may have put it), then marked canceled as `mark_canceled` marks a queued one."""
    drop_started(conn, job.origin, job.id)
    with conn.pipeline(transaction=False) as pipe:
        pipe.lrem(keys.rq_queue_key(job.origin), 0, job.id)
        drop_from_registries(pipe, [job.origin], [job.id], kinds=("scheduled", "failed"))
        mark_canceled(pipe, tenant, job.origin, [job.id], ttl, at)
        pipe.execute()


def send_stop_job(conn, tenant: str, job_id: str) -> None:
    """RQ's stop-job command to the worker its hash names (raises where the user may not publish)."""
    worker_name = conn.hget(keys.rq_job_key(tenant, job_id), "worker_name")
    if worker_name:
        send_command(conn, worker_name.decode(), "stop-job", job_id=job_id)


def queue_depths(conn) -> dict[str, int]:
    return {q.name: q.count for q in Queue.all(connection=conn)}


def tenant_job_counts(conn, queue_names: list[str] | None = None, by_engine: bool = False) -> dict[tuple, int]:
    """Jobs by (tenant, state) -- waiting, running, scheduled -- over decodebench's generation
    queues `queue_names` (None: every one RQ knows, rq:queues), of every priority; by_engine: by
    (tenant, engine, state)."""
    if queue_names is None:
        known = (k.decode() if isinstance(k, bytes) else k for k in conn.smembers(keys.RQ_QUEUES))
        queue_names = sorted(k.removeprefix(keys.RQ_QUEUE_PREFIX) for k in known)
    parsed = [(n, p) for n in queue_names if (p := keys.parse_queue(n))]
    with conn.pipeline(transaction=False) as pipe:
        for name, _ in parsed:
            pipe.llen(keys.rq_queue_key(name))
            pipe.zcard(keys.rq_registry_key("wip", name))
            pipe.zcard(keys.rq_registry_key("scheduled", name))
        replies = pipe.execute() if parsed else []
    counts: dict[tuple, int] = {}
    for i, (_, (tenant, _priority, engine)) in enumerate(parsed):
        for state, n in zip(("waiting", "running", "scheduled"), replies[3 * i : 3 * i + 3], strict=True):
            key = (tenant, engine, state) if by_engine else (tenant, state)
            counts[key] = counts.get(key, 0) + int(n)
    return counts


class WorkerState(NamedTuple):
    """An RQ worker as `decodebench cluster status` sees it."""

    host: str
    state: str  # RQ's: idle, busy, ...
    tenants: str | None  # the SHA-256 of the tenants file it runs under (None: none, or an older worker)


def worker_states(conn) -> list[WorkerState]:
    workers = Worker.all(connection=conn)
    with conn.pipeline(transaction=False) as pipe:
        for w in workers:
            pipe.hget(w.key, keys.WORKER_TENANTS_FIELD)
        digests = pipe.execute()
    return [
        WorkerState(w.hostname or "", w.get_state(), d.decode("ascii", "replace") if d else None)
        for w, d in zip(workers, digests, strict=True)
    ]


# -- inside a job ------------------------------------------------------------------------------


def current_job() -> Job | None:
    return get_current_job()


def note_failure(job: Job, reason: str) -> bool:
    """The failure's one-line reason in the job's RQ meta (where `decodebench status` and the report
    worker's controller read it; RQ's stand-in for a meta it could not read is replaced); whether RQ
    will retry the job (retries left)."""
    if not isinstance(job.meta, dict) or "unserialized" in job.meta:
        job.meta = {}
    job.meta["reason"] = reason
    job.save_meta()
    return bool(job.retries_left and job.retries_left > 0)


def fail_for_good(job: Job, reason: str) -> None:
    """The job fails for good when it fails now: RQ retries it no more; its reason in its meta."""
    job.retries_left = 0
    note_failure(job, reason)


def is_timeout(err: BaseException) -> bool:
    """Whether RQ's death penalty ended the job (its timeout)."""
    return isinstance(err, JobTimeoutException)
