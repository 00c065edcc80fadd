"""Which queues a worker takes jobs from, in which order, and how it takes them.

- `resolve_queue_names`: `--queues` values (tenants, full queue names, `*`) to the RQ queues of the
  worker's one engine (`--engine`);
- `fair_order`: tenants in their fair-share order (`worker.rq.fair`), each tenant's high,
  normal, then low queue;
- `ReliableQueue`: dequeues with LMOVE into RQ's intermediate list for every queue, so a
  job is never only in a dying worker's memory; a tenant with `max_running` is dequeued
  by one Lua step that also holds one of its slots (`worker.sweepstate.slots`);
- `bridge_rq_logging`: RQ's stdlib log lines through structlog (JSON in pods).
"""

from __future__ import annotations

import logging
import time

import structlog
from rq import Queue
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.intermediate_queue import IntermediateQueue

from worker.core import keys
from worker.core.engines import OWN_ENGINE
from worker.core.errors import UsageError
from worker.rq.sealed import sealed_job_class
from worker.sweepstate import slots


def resolve_queue_names(
    conn, selectors: list[str], declared: list[str] | None = None, engine: str = OWN_ENGINE
) -> tuple[list[str], bool]:
    """Queue names for `--queues` values: tenants, full queue names or `*`; (names, wildcard). Only the
    queues of `engine`, the one engine the worker runs (a tenant stands for its queues of that engine).

    With a tenants file (`declared`: its tenants), `*` is the declared tenants' queues and a
    tenant that is not declared is a UsageError: RQ's queue set, which anyone who can SADD may
    fill, is never read. Without one (a single team's deployment), `*` is every decodebench
    queue of the engine found in RQ's queue set, now and later (`discover_queue_names`)."""
    names: list[str] = []
    wildcard = False
    for selector in selectors:
        for part in (p.strip() for p in selector.split(",")):
            if part == "*":
                wildcard = True
                names += (
                    discover_queue_names(conn, engine)
                    if declared is None
                    else [q for t in declared for q in keys.engine_queues(t, engine)]
                )
            elif part:
                names += _selected(part, engine)
    if declared is not None:
        undeclared = sorted({t for n in names if (t := keys.parse_queue_name(n)[0]) not in declared})
        if undeclared:
            raise UsageError(f"--queues: tenant {undeclared[0]!r} is not declared in the tenants file")
    return list(dict.fromkeys(names)), wildcard and declared is None


def _selected(part: str, engine: str = OWN_ENGINE) -> list[str]:
    if parsed := keys.parse_queue(part):
        if parsed[2] != engine:
            raise UsageError(f"--queues {part!r}: a queue of engine {parsed[2]}; this worker runs engine {engine}")
        return [part]
    try:
        return keys.engine_queues(part, engine)
    except ValueError as err:
        raise UsageError(
            f"--queues {part!r}: not a tenant, a queue decodebench.<tenant>.<priority>[.<engine>] or '*' ({err})"
        ) from None


def discover_queue_names(conn, engine: str = OWN_ENGINE) -> list[str]:
    """`engine`'s decodebench queues in RQ's queue set (every tenant that has submitted)."""
    out = []
    for raw in conn.smembers(Queue.redis_queues_keys):
        name = raw.decode().removeprefix(Queue.redis_queue_namespace_prefix)
        if keys.queue_engine(name) == engine:
            out.append(name)
    return sorted(out)


class ReliableQueue(Queue):
    """Dequeues with LMOVE into RQ's intermediate list for every queue (RQ does so only for a
    worker with a single queue): a worker killed between taking a job and registering it
    leaves the job id in the intermediate list, where the reaper finds it.

    Each queue knows its tenant, whose sealed job class it uses (`worker.rq.sealed`: nothing of a
    job hash is obeyed), and the tenant's `max_running` (None: no quota) with the slot TTL (the
    heartbeat TTL). decodebench has no job dependencies: a job hash's are never enqueued."""

    POLL_S = 0.5

    def __init__(self, name: str, *, max_running: int | None = None, slot_ttl: float = 60.0, **kwargs) -> None:
        self.tenant = keys.parse_queue_name(name)[0]
        kwargs["job_class"] = sealed_job_class(self.tenant)
        super().__init__(name, **kwargs)
        self.max_running = max_running
        self.slot_ttl = slot_ttl

    def take(self, connection, target: str, block_s: int | None):
        """Move the next job id into `target` (blocking up to block_s when there is no quota)."""
        if self.max_running is not None:
            return slots.take_job(connection, self.tenant, self.key, target, self.max_running, self.slot_ttl)
        raw = connection.blmove(self.key, target, block_s) if block_s else connection.lmove(self.key, target)
        return raw.decode() if raw is not None else None

    @classmethod
    def dequeue_any(cls, queues, timeout, connection, job_class=None, serializer=None, death_penalty_class=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        queues = [
            q if isinstance(q, ReliableQueue) else cls(q.name, connection=connection, serializer=serializer)
            for q in queues
        ]
        while True:
            for queue in queues:
                target = IntermediateQueue.get_intermediate_queue_key(queue.key)
                block = len(queues) == 1 and timeout is not None  # one queue: block in Redis, no polling
                job_id = queue.take(connection, target, max(1, int(deadline - time.monotonic())) if block else None)
                if job_id is None:
                    continue
                try:  # the queue's own (tenant's) sealed job class, not the worker's
                    job = queue.job_class.fetch(job_id, connection=connection, serializer=serializer)
                except NoSuchJobError:  # deleted while queued
                    IntermediateQueue(queue.key, connection).remove(job_id)
                    slots.release_slot(connection, queue.tenant, job_id)
                    continue
                job.origin = queue.name  # the queue it was taken from, whatever its hash says
                return job, queue
            if deadline is None:
                return None
            if time.monotonic() >= deadline:
                raise DequeueTimeout(timeout, [q.key for q in queues])
            time.sleep(min(cls.POLL_S, max(0.0, deadline - time.monotonic())))

    def move_dependents_to_ready(self, job, pipeline=None, exclude_job_id=None, refresh_job_status=True) -> dict:
        return {}

    def enqueue_dependents(self, job, exclude_job_id=None, refresh_job_status=True) -> dict:
        return {}


def work_may_come_back(conn, tenants: list[str], queues) -> bool:
    """Whether a job of these queues can still come: one running (it might be lost and requeued),
    queued, taken but not started, or waiting to retry."""
    from rq.registry import ScheduledJobRegistry

    if any(conn.zcard(keys.running(t)) for t in tenants):
        return True
    return any(
        len(q)
        or conn.llen(IntermediateQueue.get_intermediate_queue_key(q.key))
        or ScheduledJobRegistry(queue=q).get_job_count(cleanup=False)
        for q in queues
    )


def fair_order(names: list[str], tenants: list[str], engine: str = OWN_ENGINE) -> list[str]:
    """Tenants in their fair-share order, and inside each its high, normal, then low queue (of `engine`)."""
    present = set(names)
    return [q for t in tenants for q in keys.engine_queues(t, engine) if q in present]


class StructlogBridge(logging.Handler):
    """RQ logs through the stdlib: pass its lines to structlog (JSON in pods)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            structlog.get_logger(record.name).log(record.levelno, record.getMessage())
        except Exception:
            self.handleError(record)


def bridge_rq_logging(level: str = "INFO") -> None:
    for name in ("rq.worker", "rq.job", "rq.queue", "rq.registry", "rq.scheduler"):
        logger = logging.getLogger(name)
        logger.handlers = [StructlogBridge()]
        logger.propagate = False
        logger.setLevel(level.upper())
