"""Submitting a sweep to RQ: plan it, store its spec, enqueue its jobs (and retry failed ones).

Jobs are genuine RQ jobs on queues `decodebench.<tenant>.<priority>` (another engine's on
`decodebench.<tenant>.<priority>.<engine>`, which only that engine's workers take), serialised as
JSON, calling `worker.rq.task.run_queued_job(job_spec_dict)` (`keys.RQ_FUNCTION`). The
sweep's job states are recorded through `worker.sweepstate`, in the same pipeline as
the enqueue, so `decodebench status` reads a few counters whatever the sweep's size.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker import sweepstate
from worker.core import keys, settings, signing
from worker.core.contract import JobSpec, JobStatus
from worker.core.engines import ENGINE_NAMES, engine_name
from worker.core.errors import UsageError
from worker.sweepstate.transitions import CHUNK


def retry_policy(retries: int | None = None):
    """RQ Retry with backoff (DECODEBENCH_RETRY_INTERVALS, default 30,120,600 seconds)."""
    from worker.core import rqadapter

    intervals = settings.get("retry_intervals")
    return rqadapter.retry(len(intervals) if retries is None else retries, intervals)


def job_timeout(job: JobSpec) -> int:
    """The job's own timeout, capped by the cluster's DECODEBENCH_JOB_TIMEOUT when set."""
    cap = settings.get("job_timeout")
    return min(job.timeout_s, cap) if cap else job.timeout_s


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


def _rq_jobs_exist(conn, tenant: str, job_ids: list[str]) -> list[bool]:
    from worker.core import rqadapter

    out: list[bool] = []
    for i in range(0, len(job_ids), CHUNK):
        out += rqadapter.jobs_exist(conn, tenant, job_ids[i : i + CHUNK])
    return out


def _to_enqueue(
    conn, jobs: list[JobSpec], tenant: str, out: SubmitOutcome, retry_failed: bool
) -> list[tuple[JobSpec, str]]:
    """(job, its current state) of the jobs to enqueue; counts the others in `out`.

    A job that is done, queued or running is not enqueued again, unless its RQ job
    vanished (Redis lost data); failed and cancelled ones only with `retry_failed`.
    """
    states = sweepstate.job_states(conn, tenant, out.sweep_id, [j.job_id for j in jobs])
    live = (JobStatus.QUEUED, JobStatus.RUNNING)
    pending = [i for i, s in enumerate(states) if s in live]
    exists = dict(zip(pending, _rq_jobs_exist(conn, tenant, [jobs[i].job_id for i in pending])))
    todo: list[tuple[JobSpec, str]] = []
    for i, (job, state) in enumerate(zip(jobs, states)):
        if state is None:
            todo.append((job, sweepstate.NONE))
        elif state == JobStatus.DONE:
            out.done += 1
        elif state in live:
            if exists[i]:
                out.pending += 1
            else:
                todo.append((job, state))
        elif retry_failed:
            todo.append((job, state))
        else:
            out.failed += 1
    return todo


def _enqueue(conn, queue, todo: list[tuple[JobSpec, str]], policy, key: bytes) -> list[str]:
    """Mark the jobs queued and write their RQ jobs, CHUNK jobs per round trip; their ids."""
    enqueued: list[str] = []
    template = rq_template(queue, policy)
    for i in range(0, len(todo), CHUNK):
        part = todo[i : i + CHUNK]
        with conn.pipeline(transaction=False) as pipe:
            sweepstate.transition_many(
                conn,
                part[0][0].tenant,
                part[0][0].sweep_id,
                [(j.job_id, j.cell, s) for j, s in part],
                JobStatus.QUEUED,
                pipeline=pipe,
            )
            bulk_enqueue(conn, queue, template, [job for job, _ in part], pipeline=pipe, key=key)
            pipe.execute()
        enqueued += [job.job_id for job, _ in part]
    return enqueued


def _drop_from_registries(pipe, tenant: str, job_ids: list[str]) -> None:
    """Retried jobs leave the tenant's failed and cancelled registries (their RQ job hashes are
    rewritten by the enqueue); results expire with their TTL."""
    from worker.core import rqadapter

    for i in range(0, len(job_ids), CHUNK):
        rqadapter.drop_from_registries(pipe, keys.tenant_queues(tenant), job_ids[i : i + CHUNK])


def check_routable(jobs: list[JobSpec]) -> None:
    """Every job's engine has its queues and workers (worker.core.keys); anything else is refused in one
    line before anything is written (the spec's validation already refuses unknown engines)."""
    unknown = next((name for j in jobs if (name := engine_name(j.engine)) not in ENGINE_NAMES), None)
    if unknown is not None:
        raise UsageError(f"engine {unknown}: no queue routes to it; use one of {', '.join(ENGINE_NAMES)}")


def job_queues(jobs: list[JobSpec], tenant: str, priority: str) -> dict[str, str]:
    """engine -> the queue its jobs go to (the own engine's first)."""
    used = {engine_name(j.engine) for j in jobs}
    return {e: keys.queue_name(tenant, priority, e) for e in ENGINE_NAMES if e in used}


def enqueue_jobs(
    conn,
    jobs: list[JobSpec],
    tenant: str,
    priority: str = "normal",
    *,
    key: bytes,
    retry_failed: bool = False,
    retries: int | None = None,
    name: str = "",
    admit: Callable[[list[JobSpec]], None] | None = None,
) -> SubmitOutcome:
    """Record the sweep in Redis and enqueue the jobs that are missing (or failed, with retry_failed),
    each signed with `key` (`worker.core.signing`: workers run only signed jobs).

    Idempotent: a job that is done, queued or running is not enqueued again. `admit`, if
    given, sees the jobs about to be enqueued before anything is written and may refuse them
    by raising (the submission server's quota).
    """
    from worker.core import rqadapter

    check_routable(jobs)
    sweep_id = jobs[0].sweep_id
    qnames = job_queues(jobs, tenant, priority)
    qname = ", ".join(qnames.values())
    out = SubmitOutcome(sweep_id, qname, len(jobs))
    meta = sweepstate.sweep_meta(conn, tenant, sweep_id)
    out.new, out.cancelled = not meta, bool(meta.get("cancelled"))
    todo = _to_enqueue(conn, jobs, tenant, out, retry_failed)
    if out.cancelled and not retry_failed:
        return out  # a cancelled sweep resumes only on purpose
    if admit is not None:
        admit([job for job, _ in todo])
    retry_from = [j.job_id for j, s in todo if s in (JobStatus.FAILED, JobStatus.CANCELLED)]
    sweepstate.prune_expired_sweeps(conn, tenant)
    with conn.pipeline(transaction=False) as pipe:
        sweepstate.register_sweep(
            pipe,
            tenant,
            sweep_id,
            jobs,
            {
                "name": name or jobs[0].sweep_name,
                "tenant": tenant,
                "n_jobs": len(jobs),
                "queue": qname,
                "cells": len({j.cell for j in jobs}),
            },
            resume=bool(todo),
            created_at=dt.datetime.now(dt.UTC).isoformat(),
        )
        _drop_from_registries(pipe, tenant, retry_from)
        sweepstate.forget_losses(pipe, tenant, retry_from)
        pipe.execute()
    for engine, name in qnames.items():  # each engine's jobs on its own queue
        mine = [(job, state) for job, state in todo if engine_name(job.engine) == engine]
        out.enqueued += _enqueue(conn, rqadapter.tenant_queue(conn, name, tenant), mine, retry_policy(retries), key)
    sweepstate.expire_sweep(conn, tenant, sweep_id, int(settings.get("sweep_ttl_days") * 86400))
    return out


PER_JOB_FIELDS = ("data", "description", "meta", "timeout", signing.SIG_FIELD)  # rq_job_fields' order


def rq_template(queue, policy) -> dict:
    """The fields RQ writes for every queued job of this queue (`worker.core.rqadapter.job_template`)."""
    from worker.core import rqadapter

    return rqadapter.job_template(queue, keys.RQ_FUNCTION, policy, keys.RESULT_TTL, keys.FAILURE_TTL)


def rq_job_fields(job: JobSpec, key: bytes) -> tuple[bytes, str, bytes, int, str]:
    """(data, description, meta, timeout, signature) of one job, serialised as RQ's JSONSerializer and
    to_dict do; the signature covers the stored (compressed) data, the tenant and the job id."""
    import zlib

    from worker.core import rqadapter

    data = rqadapter.call_data(keys.RQ_FUNCTION, job.model_dump_json().encode())
    meta = rqadapter.meta_field({"tenant": job.tenant, "sweep_id": job.sweep_id, "cell": job.cell})
    description = f"decodebench {job.cell} seed={job.seed} shard={job.shard + 1}/{job.n_shards}"
    stored = zlib.compress(data, 1)
    return stored, description, meta, job_timeout(job), signing.sign(key, job.tenant, job.job_id, stored)


def bulk_enqueue(conn, queue, template: dict, jobs: list[JobSpec], *, pipeline, key: bytes) -> None:
    """The jobs' RQ hashes, each with its signature (`decodebench_sig`), written and their ids pushed
    in one Lua call (`worker.core.rqadapter.bulk_enqueue`)."""
    from worker.core import rqadapter

    rows = [(job.job_id, dict(zip(PER_JOB_FIELDS, rq_job_fields(job, key)))) for job in jobs]
    rqadapter.bulk_enqueue(pipeline or conn, queue, template, rows)


def submit(
    conn,
    store,
    spec,
    tenant: str,
    priority: str = "normal",
    *,
    key: bytes,
    retry_failed: bool = False,
    retries: int | None = None,
) -> SubmitOutcome:
    """Plan the sweep, store its spec and plan (once), enqueue its jobs grouped by model."""
    from controller.launch.local import save_sweep
    from controller.sweep.plan import plan

    jobs = plan(spec, tenant)
    check_routable(jobs)
    save_sweep(store, spec, jobs, tenant, mode="distributed")
    return enqueue_jobs(
        conn, jobs, tenant, priority, key=key, retry_failed=retry_failed, retries=retries, name=spec.name
    )


def retry(
    conn,
    store,
    tenant: str,
    sweep_id: str,
    priority: str = "normal",
    retries: int | None = None,
    *,
    key: bytes,
    admit: Callable[[list[JobSpec]], None] | None = None,
    check: Callable[[list[JobSpec]], None] | None = None,
    parse: Callable[[dict], Any] | None = None,
) -> SubmitOutcome:
    """Enqueue the failed and cancelled jobs of a submitted sweep again (from its stored spec);
    `parse` reads the stored spec (the server's: with submit's checks, since a tenant can rewrite its own
    spec.json), `check` sees the re-planned jobs first (the server's policy), `admit` those to enqueue."""
    from controller.sweep.load import stored_spec
    from controller.sweep.plan import plan

    stored = store.load_spec(tenant, sweep_id)
    spec = parse(stored) if parse is not None else stored_spec(stored, f"stored spec of sweep {sweep_id}")
    jobs = plan(spec, tenant)
    if jobs[0].sweep_id != sweep_id:
        raise UsageError(
            f"sweep {sweep_id}: its prompts changed since it was submitted (now {jobs[0].sweep_id}); submit it again"
        )
    if check is not None:
        check(jobs)
    return enqueue_jobs(
        conn, jobs, tenant, priority, key=key, retry_failed=True, retries=retries, name=spec.name, admit=admit
    )
