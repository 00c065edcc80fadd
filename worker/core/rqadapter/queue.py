"""The worker's queue class: RQ's Queue with a dequeue that never leaves a job only in memory (rq 3.0.0).

`ReliableQueue` dequeues with LMOVE into RQ's intermediate list for every queue (RQ does so only for
a worker with a single queue): a worker killed between taking a job and registering it leaves the
job id in the intermediate list, where the reaper finds it. A tenant with `max_running` is dequeued
by one Lua step that also holds one of its slots: decodebench's slots (`worker.sweepstate.slots`)
are injected as `slots`, an object with the `Slots` protocol's two functions.
"""

from __future__ import annotations

import time
from typing import Protocol

from rq import Queue
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.intermediate_queue import IntermediateQueue
from rq.registry import ScheduledJobRegistry

from worker.core import keys
from worker.core.rqadapter.job import sealed_job_class


class Slots(Protocol):
    """A tenant's running slots across workers (`worker.sweepstate.slots`)."""

    def take_job(self, conn, tenant: str, queue_key: str, target: str, max_running: int, ttl: float) -> str | None: ...

    def release_slot(self, conn, tenant: str, job_id: str) -> None: ...


class ReliableQueue(Queue):
    """Each queue knows its tenant, whose sealed job class it uses (`job.SealedJob`: nothing of a
    job hash is obeyed), and the tenant's `max_running` (None: no quota) with the slot TTL (the
    heartbeat TTL). decodebench has no job dependencies: a job hash's are never enqueued."""

    POLL_S = 0.5

    def __init__(
        self, name: str, *, max_running: int | None = None, slot_ttl: float = 60.0, slots: Slots | None = None, **kw
    ) -> None:
        self.tenant = keys.queue_tenant(name)  # a generation or a report queue
        kw["job_class"] = sealed_job_class(self.tenant)
        super().__init__(name, **kw)
        self.max_running = max_running
        self.slot_ttl = slot_ttl
        self.slots = slots

    def take(self, connection, target: str, block_s: int | None):
        """Move the next job id into `target` (blocking up to block_s when there is no quota)."""
        if self.max_running is not None and self.slots is not None:
            return self.slots.take_job(connection, self.tenant, self.key, target, self.max_running, self.slot_ttl)
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
                    if queue.slots is not None:
                        queue.slots.release_slot(connection, queue.tenant, job_id)
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


def known_queue_names(conn) -> list[str]:
    """Every queue name in RQ's queue set (anyone who can SADD it may add one)."""
    prefix = Queue.redis_queue_namespace_prefix
    return [raw.decode().removeprefix(prefix) for raw in conn.smembers(Queue.redis_queues_keys)]


def queued_taken_or_scheduled(conn, queues) -> bool:
    """Whether any of the queues has a job queued, taken but not started, or waiting to retry."""
    return any(
        len(q)
        or conn.llen(IntermediateQueue.get_intermediate_queue_key(q.key))
        or ScheduledJobRegistry(queue=q).get_job_count(cleanup=False)
        for q in queues
    )
