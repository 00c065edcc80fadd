"""Every Redis key and RQ queue name of decodebench, built in one place (as rq's `key_for`).

RQ keeps its own keys (`rq:queue:…`, `rq:job:…`, registries). decodebench's own keys
all live under `decodebench:<tenant>:…`:

    decodebench:<t>:sweeps                   zset  sweep id -> submit time
    decodebench:<t>:running                  zset  "<sweep> <job> <cell>" -> heartbeat deadline
    decodebench:<t>:lost                     hash  job id -> times a dead worker lost it
    decodebench:<t>:doctor                   string  probe written by `decodebench doctor` (expires)
    decodebench:<t>:slots                    zset  job id -> deadline: the tenant's running slots (max_running)
    decodebench:<t>:usage                    zset  "<start> <end> <job>" -> end: worker time of the last hour
    decodebench:<t>:submit                   string  the submission server's lock on the tenant's quota (expires)
    decodebench:<t>:run:<job id>             string  the worker running the job (run once; heartbeat TTL)
    decodebench:<t>:sweep:<id>:meta          hash  name, queue, n_jobs, created/started/finished, tokens, cancelled
    decodebench:<t>:sweep:<id>:state         hash  job id -> queued|running|done|failed|cancelled
    decodebench:<t>:sweep:<id>:cells         hash  job id -> cell
    decodebench:<t>:sweep:<id>:counts        hash  "<cell>|<state>" -> number of jobs
    decodebench:<t>:sweep:<id>:failures      hash  job id -> first line of the failure reason
    decodebench:<t>:sweep:<id>:recent        list  finish times of the last jobs (throughput, ETA)
    decodebench:<t>:sweep:<id>:unavailable   hash  model path -> why it cannot load, its jobs failed, its first
                                                   load (worker.sweepstate.unavailable; written by workers only)

The submission server's own keys live under `decodebench:server:…` (`server` is a reserved
tenant name, so they never meet a tenant's):

    decodebench:server:rate:<token id>:<minute>  string  requests of one token in one minute (expires)

A sweep's keys expire DECODEBENCH_SWEEP_TTL_DAYS (default 30) after its last submit or retry, or go sooner
when the tenant's quota.held_jobs makes room for a new sweep (its oldest idle sweeps are forgotten). A
cancelled job's RQ hash loses its payload at once and expires with its canceled-registry entry (FAILURE_TTL).
RQ queues are named `decodebench.<tenant>.<priority>` for the own engine (the Helm chart relies on
it) and `decodebench.<tenant>.<priority>.<engine>` for another engine's jobs (`vllm`): a worker runs
one engine and takes only its queues (docs/engines.md).
RQ job hashes are per tenant, `rq:job:<tenant>:<job id>` (`rqadapter.tenant_job_class`; ':' is never in a
tenant name). `server_acl_keys` and `keda_acl_keys` are the key patterns of the submission
server's and KEDA's Redis users (controller/ops/acl.py).
"""

from __future__ import annotations

from worker.core.engines import ENGINE_NAMES, OWN_ENGINE
from worker.core.settings import check_tenant

PREFIX = "decodebench"
QUEUE_PREFIX = "decodebench"
PRIORITIES = ("high", "normal", "low")
RECENT = 200  # finish times kept per sweep for throughput and ETA
RESULT_TTL = 24 * 3600  # RQ keeps a finished job (and its JSON spec) a day; results live in the store
FAILURE_TTL = 7 * 24 * 3600  # failed jobs stay inspectable (and retryable from RQ) for a week
RQ_FUNCTION = "worker.rq.task.run_queued_job"  # what every RQ job of a generation queue calls
# what every job of a tenant's report queue calls: one cell of a report (a map task), run only by
# `decodebench report-worker`, a controller process (a string here: worker.core imports no controller)
REPORT_FUNCTION = "controller.report.distribute.worker.run_report_task"
REPORT_QUEUE_SUFFIX = "report"


def _t(tenant: str) -> str:
    return f"{PREFIX}:{check_tenant(tenant)}"


def sweeps(tenant: str) -> str:
    return f"{_t(tenant)}:sweeps"


def running(tenant: str) -> str:
    return f"{_t(tenant)}:running"


def running_ttls(tenant: str) -> str:
    """The heartbeat TTL of each running job's worker: running member -> seconds (status judges a job stale by
    its own worker's TTL, which may differ from the reader's)."""
    return f"{_t(tenant)}:running_ttl"


def lost(tenant: str) -> str:
    return f"{_t(tenant)}:lost"


def slots(tenant: str) -> str:
    """The tenant's running slots: job id -> deadline (written by workers only)."""
    return f"{_t(tenant)}:slots"


def usage(tenant: str) -> str:
    """Worker time spent on the tenant's jobs in the last hour (written by workers only)."""
    return f"{_t(tenant)}:usage"


def run_lock(tenant: str, job_id: str) -> str:
    """Held by the one worker running the job (SET NX, heartbeat TTL): a job id taken twice runs once."""
    return f"{_t(tenant)}:run:{job_id}"


def doctor(tenant: str) -> str:
    """Probe key written and deleted by `decodebench doctor`."""
    return f"{_t(tenant)}:doctor"


def submit_lock(tenant: str) -> str:
    """Held by the submission server while it checks the tenant's quota and enqueues."""
    return f"{_t(tenant)}:submit"


def rate(token_id: str, minute: int) -> str:
    """Requests of one token in one minute (the server's rate limit)."""
    return f"{PREFIX}:server:rate:{token_id}:{minute}"


def sweep(tenant: str, sweep_id: str, part: str) -> str:
    """`part` is one of meta, state, cells, counts, failures, recent."""
    if part not in ("meta", "state", "cells", "counts", "failures", "recent"):
        raise ValueError(f"unknown sweep key part {part!r}")
    return f"{_t(tenant)}:sweep:{sweep_id}:{part}"


def unavailable(tenant: str, sweep_id: str) -> str:
    """The sweep's models that cannot load (written by workers only; the server's user reads it, never writes)."""
    return f"{_t(tenant)}:sweep:{sweep_id}:unavailable"


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


def check_engine(engine: str) -> str:
    if engine not in ENGINE_NAMES:
        raise ValueError(f"engine {engine!r}: use one of {', '.join(ENGINE_NAMES)}")
    return engine


def queue_name(tenant: str, priority: str = "normal", engine: str = OWN_ENGINE) -> str:
    """`decodebench.<tenant>.<priority>`, with `.<engine>` after it for any engine but the own one."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority {priority!r}: use one of {', '.join(PRIORITIES)}")
    suffix = "" if check_engine(engine) == OWN_ENGINE else f".{engine}"
    return f"{QUEUE_PREFIX}.{check_tenant(tenant)}.{priority}{suffix}"


def parse_queue(name: str) -> tuple[str, str, str] | None:
    """(tenant, priority, engine) of a decodebench queue name, None for any other queue. Unambiguous
    although tenants may hold '.': no engine name is a priority."""
    head, _, rest = name.partition(".")
    engine = OWN_ENGINE
    last = rest.rpartition(".")[2]
    if last in ENGINE_NAMES and last != OWN_ENGINE:
        rest, engine = rest.rpartition(".")[0], last
    tenant, _, priority = rest.rpartition(".")
    if head != QUEUE_PREFIX or priority not in PRIORITIES or not tenant:
        return None
    try:
        check_tenant(tenant)
    except ValueError:
        return None
    return tenant, priority, engine


def parse_queue_name(name: str) -> tuple[str, str] | None:
    """(tenant, priority) of a decodebench queue name of any engine, None for any other queue."""
    parsed = parse_queue(name)
    return parsed[:2] if parsed else None


def queue_engine(name: str) -> str | None:
    """The engine whose workers take a decodebench queue's jobs, None for any other queue."""
    parsed = parse_queue(name)
    return parsed[2] if parsed else None


def engine_queues(tenant: str, engine: str = OWN_ENGINE) -> list[str]:
    """The tenant's queues that the workers of one engine take, high to low."""
    return [queue_name(tenant, p, engine) for p in PRIORITIES]


def tenant_queues(tenant: str) -> list[str]:
    """Every queue of the tenant, of every engine (the own engine's first): what status, cancel,
    retry, the quotas and the reaper look at."""
    return [q for e in ENGINE_NAMES for q in engine_queues(tenant, e)]


def report_queue(tenant: str) -> str:
    """`decodebench.<tenant>.report`: the tenant's report cells (map jobs), which only report workers
    take. Never a generation queue: those end in a priority or an engine name."""
    return f"{QUEUE_PREFIX}.{check_tenant(tenant)}.{REPORT_QUEUE_SUFFIX}"


def parse_report_queue(name: str) -> str | None:
    """The tenant of a report queue's name, None for any other queue."""
    head, _, rest = name.partition(".")
    tenant, _, last = rest.rpartition(".")
    if head != QUEUE_PREFIX or last != REPORT_QUEUE_SUFFIX or not tenant:
        return None
    try:
        return check_tenant(tenant)
    except ValueError:
        return None


def queue_tenant(name: str) -> str | None:
    """The tenant of any decodebench queue (a generation queue of any engine, or a report queue)."""
    parsed = parse_queue_name(name)
    return parsed[0] if parsed else parse_report_queue(name)


def queue_function(tenant: str, queue: str) -> str:
    """The one function a job taken from `queue` calls, whatever its payload names: the report
    function on the tenant's report queue, the generation task on any other."""
    return REPORT_FUNCTION if queue == report_queue(tenant) else RQ_FUNCTION


# -- RQ's keys for a tenant ------------------------------------------------------------------
# rq 3.x: Queue.redis_queue_namespace_prefix, Queue.redis_queues_keys, the registries'
# key_template (rq/registry.py) and IntermediateQueue's key; tests/unit/controller/ops/test_tenants.py checks
# these against the installed rq.
RQ_QUEUE_PREFIX = "rq:queue:"
RQ_QUEUES = "rq:queues"
RQ_REGISTRIES = ("wip", "failed", "finished", "canceled", "scheduled", "deferred", "ready")
# decodebench's field in an RQ worker's hash: the SHA-256 of the tenants file the worker runs under
# (worker.rq.reload; `decodebench cluster status` shows it)
WORKER_TENANTS_FIELD = "tenants_sha256"


def rq_job_prefix(tenant: str) -> str:
    return f"rq:job:{check_tenant(tenant)}:"


def rq_job_key(tenant: str, job_id: str) -> str:
    return rq_job_prefix(tenant) + job_id


def rq_queue_key(name: str) -> str:
    return RQ_QUEUE_PREFIX + name


def rq_registry_key(kind: str, queue: str) -> str:
    if kind not in RQ_REGISTRIES:
        raise ValueError(f"unknown RQ registry {kind!r}")
    return f"rq:{kind}:{queue}"


# decodebench's own keys the server writes, by their ending (every tenant's; `*` spans ':')
_SERVER_OWN = (
    "sweeps", "running", "lost", "doctor", "slots", "usage", "submit", "run:*",
    *(f"sweep:*:{part}" for part in ("meta", "state", "cells", "counts", "failures", "recent")),
)  # fmt: skip


def server_acl_keys() -> list[str]:
    """Key patterns of the submission server's Redis user (read and write): decodebench's own
    keys of every tenant (sweep state, quota counters) and RQ's keys of decodebench's queues that
    submit, status, cancel, retry, failures, logs and list touch. The server is the only client
    that writes sweeps (tenants hold no Redis credentials), so it serves every tenant. Not the
    `unavailable` marks, which only workers write (`server_acl_read_keys`)."""
    q = f"{QUEUE_PREFIX}.*"
    return [
        *(f"{PREFIX}:*:{end}" for end in _SERVER_OWN),
        f"{PREFIX}:server:*",
        rq_queue_key(q),
        "rq:job:*",
        *(rq_registry_key(kind, q) for kind in ("failed", "canceled", "scheduled")),
        RQ_QUEUES,
    ]


def server_acl_read_keys() -> list[str]:
    """Key patterns the server's Redis user may read only: the workers' marks of models that cannot load, and
    the heartbeat TTLs of their running jobs (`running_ttl`)."""
    return [f"{PREFIX}:*:sweep:*:unavailable", f"{PREFIX}:*:running_ttl"]


def keda_acl_keys() -> list[str]:
    """What KEDA's redis scaler may count: decodebench's queues (lists), started-job registries
    and scheduled (due retries) registries (sorted sets)."""
    q = f"{QUEUE_PREFIX}.*"
    return [rq_queue_key(q), rq_registry_key("wip", q), rq_registry_key("scheduled", q)]
