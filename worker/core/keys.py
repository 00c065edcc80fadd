"""Every Redis key and RQ queue name of decodebench, built in one place (as rq's `key_for`).

RQ keeps its own keys (`rq:queue:…`, `rq:job:…`, registries). decodebench's own keys
all live under `decodebench:<tenant>:…`:

    decodebench:<t>:sweeps                   zset  sweep id -> submit time
    decodebench:<t>:running                  zset  "<sweep> <job> <cell>" -> heartbeat deadline
    decodebench:<t>:lost                     hash  job id -> times a dead worker lost it
    decodebench:<t>:doctor                   string  probe written by `decodebench doctor` (expires)
    decodebench:<t>:slots                    zset  job id -> deadline: the tenant's running slots (max_running)
    decodebench:<t>:usage                    zset  "<start> <end> <job>" -> end: worker time of the last hour
    decodebench:<t>:sweep:<id>:meta          hash  name, queue, n_jobs, created/started/finished, tokens, cancelled
    decodebench:<t>:sweep:<id>:state         hash  job id -> queued|running|done|failed|cancelled
    decodebench:<t>:sweep:<id>:cells         hash  job id -> cell
    decodebench:<t>:sweep:<id>:counts        hash  "<cell>|<state>" -> number of jobs
    decodebench:<t>:sweep:<id>:failures      hash  job id -> first line of the failure reason
    decodebench:<t>:sweep:<id>:recent        list  finish times of the last jobs (throughput, ETA)

A sweep's keys expire DECODEBENCH_SWEEP_TTL_DAYS (default 30) after its last submit or retry.
RQ queues are named `decodebench.<tenant>.<priority>` (the Helm chart relies on it).
RQ job hashes are per tenant, `rq:job:<tenant>:<job id>` (`rq_job_class`): a Redis ACL
pattern `rq:job:<tenant>:*` then confines a tenant to its own jobs (':' is never in a
tenant name). `acl_keys` lists every key a tenant's controller may touch.
"""

from __future__ import annotations

import functools

from worker.core.settings import check_tenant

PREFIX = "decodebench"
QUEUE_PREFIX = "decodebench"
PRIORITIES = ("high", "normal", "low")
RECENT = 200  # finish times kept per sweep for throughput and ETA
RESULT_TTL = 24 * 3600  # RQ keeps a finished job (and its JSON spec) a day; results live in the store
FAILURE_TTL = 7 * 24 * 3600  # failed jobs stay inspectable (and retryable from RQ) for a week
RQ_FUNCTION = "worker.rq.task.run_queued_job"  # what every RQ job of decodebench calls


def _t(tenant: str) -> str:
    return f"{PREFIX}:{check_tenant(tenant)}"


def sweeps(tenant: str) -> str:
    return f"{_t(tenant)}:sweeps"


def running(tenant: str) -> str:
    return f"{_t(tenant)}:running"


def lost(tenant: str) -> str:
    return f"{_t(tenant)}:lost"


def slots(tenant: str) -> str:
    """The tenant's running slots: job id -> deadline (written by workers only)."""
    return f"{_t(tenant)}:slots"


def usage(tenant: str) -> str:
    """Worker time spent on the tenant's jobs in the last hour (written by workers only)."""
    return f"{_t(tenant)}:usage"


def doctor(tenant: str) -> str:
    """Probe key written and deleted by `decodebench doctor`."""
    return f"{_t(tenant)}:doctor"


def sweep(tenant: str, sweep_id: str, part: str) -> str:
    """`part` is one of meta, state, cells, counts, failures, recent."""
    if part not in ("meta", "state", "cells", "counts", "failures", "recent"):
        raise ValueError(f"unknown sweep key part {part!r}")
    return f"{_t(tenant)}:sweep:{sweep_id}:{part}"


def sweep_keys(tenant: str, sweep_id: str) -> dict[str, str]:
    return {p: sweep(tenant, sweep_id, p) for p in ("meta", "state", "cells", "counts", "failures", "recent")}


def split_count_field(field: str) -> tuple[str, str]:
    cell, _, state = field.rpartition("|")
    return cell, state


def running_member(sweep_id: str, job_id: str, cell: str) -> str:
    return f"{sweep_id} {job_id} {cell}"


def split_running_member(member: str) -> tuple[str, str, str]:
    sweep_id, job_id, cell = member.split(" ", 2)
    return sweep_id, job_id, cell


# -- RQ queue names -------------------------------------------------------------------------


def queue_name(tenant: str, priority: str = "normal") -> str:
    if priority not in PRIORITIES:
        raise ValueError(f"priority {priority!r}: use one of {', '.join(PRIORITIES)}")
    return f"{QUEUE_PREFIX}.{check_tenant(tenant)}.{priority}"


def parse_queue_name(name: str) -> tuple[str, str] | None:
    """(tenant, priority) of a decodebench queue name, None for any other queue."""
    head, _, rest = name.partition(".")
    tenant, _, priority = rest.rpartition(".")
    if head != QUEUE_PREFIX or priority not in PRIORITIES or not tenant:
        return None
    try:
        check_tenant(tenant)
    except ValueError:
        return None
    return tenant, priority


def tenant_queues(tenant: str) -> list[str]:
    return [queue_name(tenant, p) for p in PRIORITIES]


# -- RQ's keys for a tenant ------------------------------------------------------------------
# rq 3.x: Queue.redis_queue_namespace_prefix, Queue.redis_queues_keys, the registries'
# key_template (rq/registry.py) and IntermediateQueue's key; tests/test_tenants.py checks
# these against the installed rq.
RQ_QUEUE_PREFIX = "rq:queue:"
RQ_QUEUES = "rq:queues"
RQ_REGISTRIES = ("wip", "failed", "finished", "canceled", "scheduled", "deferred", "ready")


def rq_job_prefix(tenant: str) -> str:
    return f"rq:job:{check_tenant(tenant)}:"


def rq_job_key(tenant: str, job_id: str) -> str:
    return rq_job_prefix(tenant) + job_id


@functools.cache
def rq_job_class(tenant: str):
    """RQ's Job with the tenant's key prefix: every job hash RQ reads or writes for it (and
    its dependents/dependencies keys) lives under `rq:job:<tenant>:`."""
    from rq.job import Job

    return type(f"TenantJob_{tenant}", (Job,), {"redis_job_namespace_prefix": rq_job_prefix(tenant)})


def rq_queue_key(name: str) -> str:
    return RQ_QUEUE_PREFIX + name


def rq_registry_key(kind: str, queue: str) -> str:
    if kind not in RQ_REGISTRIES:
        raise ValueError(f"unknown RQ registry {kind!r}")
    return f"rq:{kind}:{queue}"


def acl_keys(tenant: str) -> dict[str, list[str]]:
    """Key patterns of a tenant's controller, by access: "rw" (read and write), "r" (read only).

    Exact names where a glob could reach another tenant (`decodebench.team-a.*` would match
    a tenant `team-a.x`); globs only after a ':' (never in a tenant name). The slots and
    usage keys are the workers' alone: a tenant cannot free its own quota.
    """
    t = check_tenant(tenant)
    queues = tenant_queues(t)
    rw = [f"{PREFIX}:{t}:sweeps", f"{PREFIX}:{t}:sweep:*", f"{PREFIX}:{t}:lost", f"{PREFIX}:{t}:doctor"]
    rw += [rq_job_prefix(t) + "*"] + [rq_queue_key(q) for q in queues]
    rw += [rq_registry_key(kind, q) for kind in ("failed", "canceled") for q in queues]
    return {"rw": rw, "r": [running(t)]}
