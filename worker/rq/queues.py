"""Which queues a worker takes jobs from, in which order, and how it takes them.

- `resolve_queue_names`: `--queues` values (tenants, full queue names, `*`) to the RQ queues of the
  worker's one engine (`--engine`);
- `fair_order`: tenants in their fair-share order (`worker.rq.fair`), each tenant's high,
  normal, then low queue;
- `tenant_queue`: the worker's `ReliableQueue` of a tenant (`worker.core.rqadapter.queue`: it dequeues
  with LMOVE into RQ's intermediate list for every queue, so a job is never only in a dying worker's
  memory; a tenant with `max_running` is dequeued by one Lua step that also holds one of its slots,
  `worker.sweepstate.slots`);
- `bridge_rq_logging`: RQ's stdlib log lines through structlog (JSON in pods).
"""

from __future__ import annotations

import logging

import structlog

from worker.core import keys
from worker.core.engines import OWN_ENGINE
from worker.core.errors import UsageError
from worker.core.rqadapter import SERIALIZER
from worker.core.rqadapter.queue import ReliableQueue, known_queue_names, queued_taken_or_scheduled
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
    return sorted(name for name in known_queue_names(conn) if keys.queue_engine(name) == engine)


def tenant_queue(conn, name: str, max_running: int | None, slot_ttl: float) -> ReliableQueue:
    """The worker's queue `name`: its tenant's sealed job class, quota (`max_running`) and slots."""
    return ReliableQueue(
        name, connection=conn, serializer=SERIALIZER, max_running=max_running, slot_ttl=slot_ttl, slots=slots
    )


def work_may_come_back(conn, tenants: list[str], queues) -> bool:
    """Whether a job of these queues can still come: one running (it might be lost and requeued),
    queued, taken but not started, or waiting to retry."""
    if any(conn.zcard(keys.running(t)) for t in tenants):
        return True
    return queued_taken_or_scheduled(conn, queues)


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
