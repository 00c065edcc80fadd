"""Reading a sweep's state from Redis: status, the sweep index, a job's state. Reads only:
nothing here writes (reaping lost jobs is the workers' duty, `worker.rq.reaper`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from redis.exceptions import ResponseError

from worker.core import keys, paths, settings
from worker.core.contract import JobStatus
from worker.core.errors import UsageError, short

USAGE_WINDOW_S = 3600.0  # `status --all-tenants` shows the share of worker time over the last hour


def sweep_liveness(conn, tenant: str) -> list[tuple[str, bool]]:
    """(sweep id, whether its keys still exist) for every sweep in the tenant's index, oldest first."""
    members = [m.decode() for m in conn.zrange(keys.sweeps(tenant), 0, -1)]
    with conn.pipeline(transaction=False) as pipe:
        for m in members:
            pipe.exists(keys.sweep(tenant, m, "meta"))
        alive = pipe.execute()
    return [(m, bool(ok)) for m, ok in zip(members, alive)]


def submitted_sweeps(conn, tenant: str) -> list[str]:
    """The tenant's submitted sweeps whose keys have not expired, oldest first."""
    return [m for m, alive in sweep_liveness(conn, tenant) if alive]


def resolve_sweep(conn, tenant: str, sweep: str) -> str:
    """A submitted sweep id, or a unique prefix of one."""
    paths.check_id("sweep", sweep)
    members = submitted_sweeps(conn, tenant)
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
    stale: int = 0  # running jobs whose worker missed its last heartbeats (it may be gone)
    problems: list[str] = field(default_factory=list)  # values in Redis that did not decode, one line each
    unavailable: list[tuple[str, str, int]] = field(default_factory=list)  # (model, reason, jobs failed for it)

    def total(self, state: JobStatus | str) -> int:
        state = state.value if isinstance(state, JobStatus) else state
        return sum(c.get(state, 0) for c in self.cells.values())

    @property
    def complete(self) -> bool:
        return self.total(JobStatus.QUEUED) + self.total(JobStatus.RUNNING) == 0

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
        left = self.total(JobStatus.QUEUED) + self.total(JobStatus.RUNNING)
        rate = self.jobs_per_s
        return left / rate if rate and left else (0.0 if not left else None)


class _Reader:
    """Decodes a sweep's Redis values for `read_status`; what does not decode (another
    process's or a hand's write) is left out and named once in `problems`."""

    def __init__(self, keys_: dict[str, str]) -> None:
        self.keys = keys_
        self.problems: list[str] = []

    def reply(self, part: str, value, empty):
        """A pipeline reply, or `empty` if the key holds another Redis type (WRONGTYPE)."""
        if not isinstance(value, ResponseError):
            return value
        if not str(value).startswith("WRONGTYPE"):
            raise value  # NOPERM and other refusals are the caller's to see
        self.problems.append(f"{self.keys[part]} is not of its Redis type; left out")
        return empty

    def number(self, where: str, raw, kind=float):
        try:
            value = kind(raw)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            self.problems.append(f"{where}: {short(raw)} is not a finite number; left out")
            return None
        return value


def _text(raw: bytes) -> str:
    return raw.decode(errors="replace")


def read_status(conn, tenant: str, sweep_id: str, *, max_failures: int = 20) -> SweepStatus:
    """The sweep's counters: O(cells + max_failures + marked models) Redis reads, three round trips; changes
    nothing.

    Fields that are missing read as unknown; values that do not decode are left out and named
    in `problems` (one line each)."""
    k = keys.sweep_keys(tenant, sweep_id)
    with conn.pipeline(transaction=False) as pipe:
        pipe.hgetall(k["meta"])
        pipe.hgetall(k["counts"])
        pipe.hlen(k["failures"])
        pipe.hscan(k["failures"], 0, count=max_failures)
        pipe.lrange(k["recent"], 0, -1)
        replies = pipe.execute(raise_on_error=False)
    r = _Reader(k)
    parts = (("meta", {}), ("counts", {}), ("failures", 0), ("failures", (0, {})), ("recent", []))
    meta_raw, counts_raw, n_failures, (_, failures_raw), recent = (
        r.reply(part, value, empty) for (part, empty), value in zip(parts, replies)
    )
    if not meta_raw:
        raise UsageError(
            f"no submitted sweep {sweep_id!r} for tenant {tenant!r}" + "".join(f"; {p}" for p in r.problems)
        )
    meta = {_text(a): _text(b) for a, b in meta_raw.items()}
    cells: dict[str, dict[str, int]] = {}
    for f, n in counts_raw.items():
        cell, state = keys.split_count_field(_text(f))
        count = r.number(f"{k['counts']} {short(_text(f))}", _text(n), int)
        if count:
            cells.setdefault(cell, {})[state] = count
    failure_ids = [_text(j) for j in list(failures_raw)[:max_failures]]
    failure_cells = r.reply("cells", _hmget(conn, k["cells"], failure_ids), [None] * len(failure_ids))
    failures = [(j, _text(c or b""), _text(failures_raw[j.encode()])) for j, c in zip(failure_ids, failure_cells)]

    def num(name: str, kind=float):
        return r.number(f"{k['meta']} {name}", meta[name], kind) if meta.get(name) else None

    return SweepStatus(
        tenant=tenant,
        sweep_id=sweep_id,
        name=meta.get("name", ""),
        queue=meta.get("queue", ""),
        n_jobs=num("n_jobs", int) or 0,
        cells=dict(sorted(cells.items())),
        failures=sorted(failures, key=lambda f: f[1]),
        n_failures=n_failures,
        started_at=num("started_at"),
        last_done_at=num("last_done_at"),
        new_tokens=num("new_tokens", int) or 0,
        generations=num("generations", int) or 0,
        recent=[x for x in (r.number(k["recent"], _text(x)) for x in recent) if x is not None],
        cancelled=bool(meta.get("cancelled")),
        lost=num("lost", int) or 0,
        stale=stale_runs(conn, tenant, sweep_id),
        problems=r.problems,
        unavailable=read_unavailable(conn, tenant, sweep_id, meta.get("epoch", "")),
    )


def read_unavailable(conn, tenant: str, sweep_id: str, epoch: str) -> list[tuple[str, str, int]]:
    """(model path, reason, jobs failed for it) of every model the sweep's workers marked unavailable in the
    current `epoch` (worker.sweepstate.unavailable)."""
    raw = {_text(k): _text(v) for k, v in (conn.hgetall(keys.unavailable(tenant, sweep_id)) or {}).items()}
    out = []
    for name, value in raw.items():
        stamp, _, reason = value.partition(" ")
        if "\t" in name or stamp != epoch or not reason:
            continue
        jobs = raw.get(f"{name}\tjobs", "0")
        out.append((name, reason, int(jobs) if jobs.isdigit() else 0))
    return sorted(out)


def stale_runs(conn, tenant: str, sweep_id: str) -> int:
    """The sweep's running jobs whose worker has not beaten for half its heartbeat TTL (three beats): their
    worker may be gone; the reaper requeues them once the TTL has passed. Each job by its own worker's TTL
    (`running_ttl`, written when it started), the reader's DECODEBENCH_HEARTBEAT_TTL where none is recorded."""
    now, fallback = time.time(), float(settings.get("heartbeat_ttl"))
    try:
        running = conn.zrange(keys.running(tenant), 0, -1, withscores=True)
        mine = [(m, deadline) for m, deadline in running if _text(m).startswith(f"{sweep_id} ")]
        ttls = conn.hmget(keys.running_ttls(tenant), [m for m, _ in mine]) if mine else []
    except Exception:  # a damaged key: status still answers
        return 0
    return sum(1 for (_, deadline), ttl in zip(mine, ttls) if deadline - now < _seconds(ttl, fallback) / 2)


def _seconds(raw, fallback: float) -> float:
    try:
        value = float(_text(raw)) if raw is not None else fallback
    except ValueError:
        return fallback
    return value if math.isfinite(value) and value > 0 else fallback


def _hmget(conn, key: str, fields: list[str]):
    """HMGET, or the WRONGTYPE error as a value (for `_Reader.reply`)."""
    if not fields:
        return []
    try:
        return conn.hmget(key, fields)
    except ResponseError as err:
        if not str(err).startswith("WRONGTYPE"):
            raise
        return err


def find_job_sweep(conn, tenant: str, job_id: str) -> str | None:
    """The submitted sweep of tenant that holds `job_id` (one pipelined HEXISTS per sweep)."""
    sweeps = [m.decode() for m in conn.zrange(keys.sweeps(tenant), 0, -1)]
    with conn.pipeline(transaction=False) as pipe:
        for sweep_id in sweeps:
            pipe.hexists(keys.sweep(tenant, sweep_id, "cells"), job_id)
        found = pipe.execute()
    return next((s for s, hit in zip(sweeps, found) if hit), None)


def job_state(conn, tenant: str, sweep_id: str, job_id: str) -> str | None:
    """The job's recorded state (a JobStatus value), None if the sweep never recorded it."""
    state = conn.hget(keys.sweep(tenant, sweep_id, "state"), job_id)
    return state.decode() if state else None


def is_cancelled(conn, tenant: str, sweep_id: str) -> bool:
    """Whether the sweep was cancelled (and not resumed since)."""
    return bool(conn.hget(keys.sweep(tenant, sweep_id, "meta"), "cancelled"))


def sweep_meta(conn, tenant: str, sweep_id: str) -> dict[str, str]:
    """The sweep's meta hash (name, queue, n_jobs, times, cancelled...); empty if never submitted."""
    return {k.decode(): v.decode() for k, v in conn.hgetall(keys.sweep(tenant, sweep_id, "meta")).items()}


def job_states(conn, tenant: str, sweep_id: str, job_ids: list[str], chunk: int = 5000) -> list[str | None]:
    """Each job's recorded state (a JobStatus value), None where the sweep never recorded it."""
    key = keys.sweep(tenant, sweep_id, "state")
    out: list[str | None] = []
    for i in range(0, len(job_ids), chunk):
        out += [s.decode() if s else None for s in conn.hmget(key, job_ids[i : i + chunk])]
    return out


def usage_seconds(conn, tenant: str, now: float | None = None, window: float = USAGE_WINDOW_S) -> float:
    """Worker seconds spent on the tenant's jobs within the last `window` seconds."""
    now = time.time() if now is None else now
    total = 0.0
    for raw in conn.zrangebyscore(keys.usage(tenant), now - window, "+inf"):
        start, end, _ = raw.decode().split(" ", 2)
        total += max(0.0, min(float(end), now) - max(float(start), now - window))
    return total


def known_tenants(conn) -> list[str]:
    """Tenants with a decodebench queue in RQ's queue set (needs the workers' Redis user)."""
    names = {m.decode().removeprefix(keys.RQ_QUEUE_PREFIX) for m in conn.smembers(keys.RQ_QUEUES)}
    return sorted({p[0] for n in names if (p := keys.parse_queue_name(n))})


@dataclass
class TenantOverview:
    tenant: str
    queued: int
    running: int
    done: int
    worker_s: float  # worker seconds on its jobs over the last hour


def tenant_overview(conn, tenant: str) -> TenantOverview:
    """Queued (in its queues), running (live heartbeats), done (its live sweeps) and worker time."""
    queued = sum(conn.llen(keys.rq_queue_key(q)) for q in keys.tenant_queues(tenant))
    running = conn.zcount(keys.running(tenant), time.time(), "+inf")
    done = 0
    for sweep_id in submitted_sweeps(conn, tenant):
        for name, n in conn.hgetall(keys.sweep(tenant, sweep_id, "counts")).items():
            if keys.split_count_field(name.decode())[1] == JobStatus.DONE.value:
                done += int(n)
    return TenantOverview(tenant, queued, running, done, usage_seconds(conn, tenant))


# -- what a tenant holds in Redis (the submission server's quotas) ---------------------------


def queued_jobs(conn, tenant: str) -> int:
    """Job ids waiting in the tenant's queues."""
    with conn.pipeline(transaction=False) as pipe:
        for q in keys.tenant_queues(tenant):
            pipe.llen(keys.rq_queue_key(q))
        return sum(pipe.execute())


def queued_report_cells(conn, tenant: str) -> int:
    """Report cells (map jobs of `report --distributed`) waiting in the tenant's report queue."""
    return conn.llen(keys.rq_queue_key(keys.report_queue(tenant)))


def queued_payload_bytes(conn, tenant: str, chunk: int = 5000) -> int:
    """Bytes of the stored (compressed) payloads of the jobs waiting in the tenant's queues."""
    total = 0
    for q in keys.tenant_queues(tenant):
        key, start = keys.rq_queue_key(q), 0
        while ids := conn.lrange(key, start, start + chunk - 1):
            with conn.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hstrlen(keys.rq_job_key(tenant, job_id.decode()), "data")
                total += sum(pipe.execute())
            start += chunk
    return total


def held_sweeps(conn, tenant: str) -> list[tuple[str, int, bool]]:
    """(sweep id, jobs its keys record, whether a job is still queued or running) of each of the tenant's
    live sweeps, oldest first: what Redis holds for the tenant (quota.held_jobs) and which could go."""
    live = submitted_sweeps(conn, tenant)
    with conn.pipeline(transaction=False) as pipe:
        for sweep_id in live:
            pipe.hlen(keys.sweep(tenant, sweep_id, "cells"))
            pipe.hgetall(keys.sweep(tenant, sweep_id, "counts"))
        replies = pipe.execute()
    busy = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
    out = []
    for sweep_id, held, fields in zip(live, replies[::2], replies[1::2]):
        live_jobs = any(keys.split_count_field(f.decode())[1] in busy and int(n) > 0 for f, n in fields.items())
        out.append((sweep_id, int(held), live_jobs))
    return out


def sweeps_in_flight(conn, tenant: str) -> list[str]:
    """The tenant's live sweeps with a job still queued or running."""
    return [sweep_id for sweep_id, _, busy in held_sweeps(conn, tenant) if busy]
