"""What the planner of report jobs remembers of a sweep between its calls: the cells, then the pairs.

`report --distributed` asks the submission server (or the operator's own process) twice: for the
cells missing from the report cache, then, once they are in, for the pairs. Each call planned the
sweep from the store, every job's result.json read (190k for a team sweep: minutes from S3), and a
report asked again of an unchanged sweep read them all again to find that nothing was missing.

A `PlanMemo` keeps, per (tenant, sweep, n_boot, seed, n_boot_corpus), the small part of a plan those
calls need: the settings and each cell's key, model, strategy and cache digest (`Basis`, a few
hundred bytes a cell, never a job), under the sweep's fingerprint: a hash of the store's version tag
(an S3 ETag and size, a file's inode, mtime and size) of each of its job files, its spec and its
plan, listed before the plan was read (a listing: a round trip per 1,000 keys, no object read). A
call whose listing gives another fingerprint (a job retried or finished, a spec rewritten) plans
afresh, so a memo never answers for data it was not planned from; one that gives the same reads no
result.json. The memo lives in the planning process only (a server restart, or another replica,
plans afresh: from the sweep's results snapshot, report.snapshot, one object and what changed since).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker.core import paths
from worker.core.errors import UsageError

if TYPE_CHECKING:  # light to import: the submission server's Context holds a PlanMemo
    from controller.report.compute.cells import CellTask, Settings
    from worker.store import Store

MEMO_SWEEPS = 32  # sweeps (with their settings) remembered, the least recently used dropped first
MEMO_CELLS = 100_000  # cells remembered over all of them (~30 MB): a tenant's many seeds cannot grow the server


@dataclass(frozen=True)
class Basis:
    """What planning a sweep's report jobs needs once its cells are known: the settings, and each
    cell's (key, model, strategy, cache digest), in plan order (digest None: not cacheable)."""

    settings: Settings
    cells: tuple[tuple[str, str, str, str | None], ...]

    @classmethod
    def of(cls, settings: Settings, tasks: list[CellTask]) -> Basis:
        from controller.report.compute.cells import digest

        rows = ((t.cell, str(t.row["model"]), str(t.row["strategy"]), digest(t, settings)) for t in tasks)
        return cls(settings, tuple(rows))

    @property
    def digests(self) -> dict[str, str | None]:
        return {cell: d for cell, _, _, d in self.cells}


def versions(store: Store, tenant: str, sweep_id: str) -> dict[str, str]:
    """The version tags of everything a plan reads: the sweep's job files, spec and plan."""
    tags: dict[str, str] = {}
    for prefix in (
        paths.jobs_prefix(tenant, sweep_id),
        paths.spec_key(tenant, sweep_id),
        paths.plan_key(tenant, sweep_id),
    ):
        tags |= store.list_versions(prefix)
    return tags


def fingerprint(store: Store, tenant: str, sweep_id: str, tags: dict[str, str] | None = None) -> str:
    """A hash of `versions` (listed here unless given)."""
    tags = versions(store, tenant, sweep_id) if tags is None else tags
    h = hashlib.sha256()
    for key in sorted(tags):
        h.update(f"{key}\0{tags[key]}\n".encode())
    return h.hexdigest()


@dataclass
class Lookup:
    """One call's view of the memo: the basis remembered for this sweep, settings and fingerprint
    (None: plan from the store, `plan`), and where to remember the one the call plans."""

    memo: PlanMemo | None
    store: Store
    key: tuple  # (tenant, sweep id, n_boot, seed, n_boot_corpus)
    fingerprint: str | None
    basis: Basis | None
    versions: dict[str, str] | None = None  # the tags the fingerprint was listed from: the plan's complete jobs

    def plan(self) -> tuple[list[CellTask], Basis]:
        """The sweep's cells as `summarize` plans them, from the store (its results, not its
        generations), and their basis, remembered under the fingerprint listed before the read; the
        complete jobs are those of that listing (the jobs are not listed twice)."""
        from controller.metrics import METRICS
        from controller.report.compute.aggregate import cell_tasks
        from controller.report.load.sweep import load_sweep

        tenant, sweep_id, n_boot, seed, n_boot_corpus = self.key
        data = load_sweep(self.store, tenant, sweep_id, with_generations=False, versions=self.versions)
        if not data.results:
            raise UsageError(f"sweep {sweep_id} has no complete jobs yet")
        _, settings, tasks = cell_tasks(data, n_boot, seed, n_boot_corpus, METRICS, self.store)
        basis = Basis.of(settings, tasks)
        if self.memo is not None and self.fingerprint is not None:
            self.memo.put(self.key, self.fingerprint, basis)
        return tasks, basis


class PlanMemo:
    """The last `size` sweeps' bases (at most `max_cells` cells in all), each under the fingerprint it
    was planned from; thread-safe (the server plans in a thread pool)."""

    def __init__(self, size: int = MEMO_SWEEPS, max_cells: int = MEMO_CELLS) -> None:
        self.size, self.max_cells = size, max_cells
        self._entries: OrderedDict[tuple, tuple[str, Basis]] = OrderedDict()
        self._cells = 0
        self._lock = threading.Lock()

    def get(self, key: tuple, fp: str) -> Basis | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None or found[0] != fp:
                return None
            self._entries.move_to_end(key)
            return found[1]

    def put(self, key: tuple, fp: str, basis: Basis) -> None:
        with self._lock:
            if key in self._entries:
                self._cells -= len(self._entries.pop(key)[1].cells)
            if len(basis.cells) > self.max_cells:  # a sweep larger than the whole memo is planned each time
                return
            self._entries[key] = (fp, basis)
            self._cells += len(basis.cells)
            while len(self._entries) > self.size or self._cells > self.max_cells:
                self._cells -= len(self._entries.popitem(last=False)[1][1].cells)


def lookup(memo: PlanMemo | None, store: Store, tenant: str, sweep_id: str, *settings: int) -> Lookup:
    """The memo's basis for this sweep and these settings (n_boot, seed, n_boot_corpus) if the sweep's
    fingerprint, listed now, is the one it was planned from; no memo: no listing, nothing found."""
    key = (tenant, sweep_id, *settings)
    if memo is None:
        return Lookup(None, store, key, None, None)
    tags = versions(store, tenant, sweep_id)
    fp = fingerprint(store, tenant, sweep_id, tags)
    return Lookup(memo, store, key, fp, memo.get(key, fp), tags)
