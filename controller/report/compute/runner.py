"""Where report tasks run: here, in a process pool, or on the cluster's report workers.

One runner for every kind of report task (controller.report.compute.tasks: a cell's statistics, a
pair's comparison), as optimum-benchmark's launchers run any scenario. For a list of tasks it:

1. reads from the report cache (controller.report.compute.cache) every task's entry that is there,
   listed once;
2. asks the report workers (`remote`, controller.report.distribute.remote.ReportWorkers) for the
   rest, where the runner has them, and reads what they wrote to the cache;
3. computes what is still missing: in a process pool of `workers` (0: one per CPU) where there is
   more than one and `workers` != 1, else here; each output written to the cache as it comes.

Steps 2 and 3's pool only take portable tasks (the global registry's metrics, which another process
finds by name). `run` yields (index, output) as outputs are had, so that its caller keeps of each
only what it needs (a cell's row, not its per-prompt statistics); `progress(what, done, total)`
follows it, never backwards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from controller.report.compute.cache import ReportCache
from controller.report.compute.tasks import ReportTask, Uncacheable

Tick = Callable[[str, int, int], None]  # progress(what, done, total), as load_sweep's (load.sweep)


class Remote(Protocol):
    """A backend that has tasks computed elsewhere and waits for their entries in the cache."""

    def compute(self, tasks: list[ReportTask], cache: ReportCache, what: str) -> Iterator[int]: ...


def run_task(task: ReportTask) -> Any:
    """What a pool process runs (module-level: picklable)."""
    return task.run()


class Meter:
    """A phase's progress, shown as outputs are had; never backwards (the workers' count, then this process's)."""

    def __init__(self, progress: Tick | None, what: str, total: int) -> None:
        self.progress, self.what, self.total, self.shown = progress, what, total, -1

    def show(self, done: int) -> None:
        if self.progress is not None and done > self.shown:
            self.shown = done
            self.progress(self.what, done, self.total)


@dataclass
class Runner:
    workers: int = 1
    remote: Remote | None = None
    progress: Tick | None = None

    def run(self, tasks: Sequence[ReportTask], cache: ReportCache | None, what: str) -> Iterator[tuple[int, Any]]:
        """Every task's output, as (its index, the output), each exactly once: from the cache, else computed."""
        meter = Meter(self.progress, what, len(tasks))
        had: set[int] = set()
        for i, out in self._cached(tasks, range(len(tasks)), cache):
            had.add(i)
            yield i, out
        meter.show(len(had))
        portable = all(t.portable for t in tasks)
        sent = [i for i in range(len(tasks)) if i not in had and tasks[i].name is not None]
        if self.remote is not None and cache is not None and portable and sent:
            for ready in self.remote.compute([tasks[i] for i in sent], cache, what):
                meter.show(len(had) + ready)
            for i, out in self._cached(tasks, sent, cache):
                had.add(i)
                yield i, out
            meter.show(len(had))
        todo = [i for i in range(len(tasks)) if i not in had]
        for i, out in self._computed(tasks, todo, portable):
            name = tasks[i].name
            if cache is not None and name is not None:
                with contextlib.suppress(Uncacheable):  # e.g. a cell with a damaged job: computed again next time
                    cache.write(name, tasks[i].entry(out))
            had.add(i)
            yield i, out
            meter.show(len(had))

    def _cached(
        self, tasks: Sequence[ReportTask], among: Iterable[int], cache: ReportCache | None
    ) -> Iterator[tuple[int, Any]]:
        """The outputs of the tasks `among` whose entries the cache holds (one listing), as they are read;
        a damaged entry is left out (computed again)."""
        named = [(i, name) for i in among if (name := tasks[i].name) is not None]
        if cache is None or not named:
            return
        listing = cache.listing()
        for i, name in named:
            if not cache.holds(listing, name) or (entry := cache.read(name)) is None:
                continue
            try:
                out = tasks[i].output(entry)
            except (KeyError, TypeError, ValueError):
                continue
            yield i, out

    def _computed(self, tasks: Sequence[ReportTask], todo: list[int], portable: bool) -> Iterator[tuple[int, Any]]:
        if self.workers != 1 and portable and len(todo) > 1:
            with ProcessPoolExecutor(max_workers=self.workers if self.workers > 0 else os.cpu_count()) as pool:
                yield from zip(todo, pool.map(run_task, [tasks[i] for i in todo], chunksize=1))
        else:
            for i in todo:
                yield i, tasks[i].run()
