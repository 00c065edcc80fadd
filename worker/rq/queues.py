"""Which queues a worker takes jobs from, in which order, and how it takes them.

- `resolve_queue_names`: `--queues` values (tenants, full queue names, `*`) to RQ queues;
- `fair_order`: high before normal before low, round-robin across tenants within a priority;
- `ReliableQueue`: dequeues with LMOVE into RQ's intermediate list for every queue, so a
  job is never only in a dying worker's memory;
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
from worker.core.errors import UsageError


def resolve_queue_names(conn, selectors: list[str]) -> tuple[list[str], bool]:
    """Queue names for `--queues` values: tenants, full queue names or `*`; (names, wildcard)."""
    names: list[str] = []
    wildcard = False
    for selector in selectors:
        for part in (p.strip() for p in selector.split(",")):
            if not part:
                continue
            if part == "*":
                wildcard = True
                names += discover_queue_names(conn)
            elif keys.parse_queue_name(part):
                names.append(part)
            else:
                try:
                    names += keys.tenant_queues(part)
                except ValueError as err:
                    raise UsageError(
                        f"--queues {part!r}: not a tenant, a queue decodebench.<tenant>.<priority> or '*' ({err})"
                    ) from None
    return list(dict.fromkeys(names)), wildcard


def discover_queue_names(conn) -> list[str]:
    """decodebench queues in RQ's queue set (every tenant that has submitted)."""
    out = []
    for raw in conn.smembers(Queue.redis_queues_keys):
        name = raw.decode().removeprefix(Queue.redis_queue_namespace_prefix)
        if keys.parse_queue_name(name):
            out.append(name)
    return sorted(out)


class ReliableQueue(Queue):
    """Dequeues with LMOVE into RQ's intermediate list for every queue (RQ does so only for a
    worker with a single queue): a worker killed between taking a job and registering it
    leaves the job id in the intermediate list, where the reaper finds it."""

    POLL_S = 0.5

    @classmethod
    def dequeue_any(cls, queues, timeout, connection, job_class=None, serializer=None, death_penalty_class=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for queue in queues:
                target = IntermediateQueue.get_intermediate_queue_key(queue.key)
                if len(queues) == 1 and timeout is not None:  # one queue: block in Redis, no polling
                    raw = connection.blmove(queue.key, target, max(1, int(deadline - time.monotonic())))
                else:
                    raw = connection.lmove(queue.key, target)
                if raw is None:
                    continue
                job_id = raw.decode()
                try:
                    job = (job_class or cls.job_class).fetch(job_id, connection=connection, serializer=serializer)
                except NoSuchJobError:  # deleted while queued
                    IntermediateQueue(queue.key, connection).remove(job_id)
                    continue
                return job, queue
            if deadline is None:
                return None
            if time.monotonic() >= deadline:
                raise DequeueTimeout(timeout, [q.key for q in queues])
            time.sleep(min(cls.POLL_S, max(0.0, deadline - time.monotonic())))


def fair_order(names: list[str], tenants: list[str]) -> list[str]:
    """Priority first (high, normal, low), then tenants in their round-robin order."""
    present = set(names)
    return [q for p in keys.PRIORITIES for t in tenants if (q := keys.queue_name(t, p)) in present]


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
