"""Every Redis key and RQ queue name of decodebench, built in one place (as rq's `key_for`).

RQ keeps its own keys (`rq:queue:…`, `rq:job:…`, registries). decodebench's own keys
all live under `decodebench:<tenant>:…`:

    decodebench:<t>:sweeps                   zset  sweep id -> submit time
    decodebench:<t>:running                  zset  "<sweep> <job> <cell>" -> heartbeat deadline
    decodebench:<t>:lost                     hash  job id -> times a dead worker lost it
    decodebench:<t>:doctor                   string  probe written by `decodebench doctor` (expires)
    decodebench:<t>:sweep:<id>:meta          hash  name, queue, n_jobs, created/started/finished, tokens, cancelled
    decodebench:<t>:sweep:<id>:state         hash  job id -> queued|running|done|failed|cancelled
    decodebench:<t>:sweep:<id>:cells         hash  job id -> cell
    decodebench:<t>:sweep:<id>:counts        hash  "<cell>|<state>" -> number of jobs
    decodebench:<t>:sweep:<id>:failures      hash  job id -> first line of the failure reason
    decodebench:<t>:sweep:<id>:recent        list  finish times of the last jobs (throughput, ETA)

A sweep's keys expire DECODEBENCH_SWEEP_TTL_DAYS (default 30) after its last submit or retry.
RQ queues are named `decodebench.<tenant>.<priority>` (the Helm chart relies on it).
"""

from __future__ import annotations

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


def count_field(cell: str, state: str) -> str:
    return f"{cell}|{state}"


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
