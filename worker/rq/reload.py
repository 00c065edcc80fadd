"""A running worker follows its tenants file (DECODEBENCH_TENANTS_FILE) without a restart.

The chart mounts the tenants ConfigMap as a directory (no subPath), so the kubelet replaces the
file within its sync period (about a minute) when the ConfigMap changes; rolling GPU pods for it
would cost every model load and drain. Every reaper interval the worker reads the file; when its
content changed and it is valid, the worker takes, between two jobs' dequeues:

- weights (fair share) and `max_running` of every tenant it serves;
- its queues: with `*` the declared tenants' queues (a new tenant is served with its policy from
  its first job), and a tenant no longer declared is no longer dequeued (its jobs stay queued:
  a tenant removed by mistake loses nothing);
- the policy (allowed models, trust_remote_code) that the next job is checked against.

Every check writes the SHA-256 of the file in force into the worker's RQ hash (`tenants_sha256`):
which workers have taken a ConfigMap change is one HGET each.

The running job keeps the policy it was admitted under and runs on. A file that no longer parses
is logged once (one line naming the field) and the last good one stays in force. The file is
applied by the heartbeat thread while the main thread's dequeue may be polling the old queues: a
job it takes of a tenant the current file does not declare goes back to the front of its queue
(`DecodebenchLogic.held_back`), neither run nor failed; were it ever run, it would be refused,
never run unpoliced (`worker.rq.task.refusal`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import structlog

from worker.core import keys
from worker.core.engines import OWN_ENGINE
from worker.core.errors import UsageError
from worker.core.tenants import TenantsFile, load_tenants
from worker.rq.queues import _selected

log = structlog.get_logger("decodebench.worker")


class TenantsReload:
    """Watches one tenants file by content (a ConfigMap update swaps a symlink: mtimes lie)."""

    def __init__(self, path: str | Path, loaded: TenantsFile | None = None) -> None:
        """`loaded`: the file as the worker loaded it from `path` at start."""
        self.path = Path(path)
        self.digest = self._digest()  # of the content last read, valid or not
        self.in_force = self.digest  # of the content in force: the last valid one
        self.loaded = loaded

    def _digest(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None

    def changed(self) -> TenantsFile | None:
        """The new tenants file if its content changed and parses; None otherwise."""
        digest = self._digest()
        if digest is None or digest == self.digest:
            return None
        self.digest = digest  # a bad file is reported once, not on every check
        try:
            self.loaded = load_tenants(self.path)
        except UsageError as err:
            log.error("worker.tenants_reload_failed", error=str(err), kept="the last valid tenants file")
            return None
        self.in_force = digest
        return self.loaded


def declared_queue_names(
    selectors: list[str], tenants: TenantsFile, engine: str = OWN_ENGINE
) -> tuple[list[str], list[str]]:
    """(queue names of `engine` the selectors give under `tenants`, tenants named but not declared)."""
    declared = [t.name for t in tenants.tenants]
    names: list[str] = []
    for selector in selectors:
        for part in (p.strip() for p in selector.split(",")):
            if part == "*":
                names += [q for t in declared for q in keys.engine_queues(t, engine)]
            elif part:
                names += _selected(part, engine)
    undeclared = sorted({t for n in names if (t := keys.parse_queue_name(n)[0]) not in declared})
    return [n for n in dict.fromkeys(names) if keys.parse_queue_name(n)[0] in declared], undeclared


def apply(worker, tenants: TenantsFile) -> None:
    """Make `worker` (a `DecodebenchLogic`) serve under `tenants` from its next dequeue on."""
    names, undeclared = declared_queue_names(worker.selectors, tenants, worker.engine)
    if undeclared:
        log.warning("worker.tenants_undeclared", tenants=undeclared, then="their queues are not served")
    before = {q.name for q in worker.queues}
    worker.tenant_file = tenants
    worker.fair.weights = {t.name: t.weight for t in tenants.tenants}
    kept = [q for q in worker.queues if q.name in names]
    for q in kept:
        policy = tenants.get(q.tenant)
        q.max_running = policy.max_running if policy else None
    for tenant in {keys.parse_queue_name(n)[0] for n in before - set(names)}:
        worker.fair.passes.pop(tenant, None)
        worker.fair.last.pop(tenant, None)
    worker.queues = kept
    worker._set_queues(names)  # adds the new tenants' queues with their max_running, and reorders
    worker.connection.hset(worker.key, "queues", ",".join(worker.queue_names()))
    log.info(
        "worker.tenants_reloaded",
        tenants=[t.name for t in tenants.tenants],
        added=sorted(set(names) - before),
        removed=sorted(before - set(names)),
    )


def reload_tenants(worker) -> bool:
    """Check the worker's tenants file; apply it if it changed. Whether it did. The worker's RQ hash
    names the SHA-256 of the file in force (`tenants_sha256`, written every check: an operator compares
    it with `sha256sum` of the mounted file to see which workers have taken a ConfigMap change)."""
    watch = getattr(worker, "tenants_reload", None)
    if watch is None:
        return False
    new = watch.changed()
    if new is not None:
        apply(worker, new)
    if watch.in_force is not None:
        worker.connection.hset(worker.key, keys.WORKER_TENANTS_FIELD, watch.in_force)
    return new is not None
