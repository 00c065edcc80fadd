"""A sweep's report cache: one content-addressed store of what a report computes, under report/cache/.

Every entry is named by the content digest of what it depends on, so an entry is never stale and
deleting report/cache/ between reports is always safe. Its users, each with a name of its own:

- a cell's output (`<digest>.json`, controller.report.compute.cells);
- a (cell, baseline) pair's comparison (`pair-<digest>.json`, controller.report.compute.pairs);
- a judge's reply (`judge-<digest>.json`, controller.judge.run), and a share of a report's judge
  requests, done (`judgeshare-<digest>.json`: the list of its requests, controller.judge.jobs);
- the sweep's results snapshot (controller.report.load.snapshot) lives beside them.

A task a report worker could not compute leaves a failure mark instead (`<name>.fail.json`, its
one-line reason), which the controller waiting for the entry reads as "compute it here".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from worker.core import paths
from worker.core.errors import CorruptRecordError

log = structlog.get_logger("decodebench.report")
LIST_SHARE = 0.1  # a wait for report workers spends at most this share of its time listing
FAIL = ".fail"  # a failure mark's suffix, before .json


@dataclass
class ReportCache:
    """The report cache of one sweep of one tenant, in a store."""

    store: Any
    tenant: str
    sweep_id: str

    def key(self, name: str) -> str:
        """Where the entry `name` (e.g. a cell's digest, `pair-<digest>`) is in the store."""
        return paths.report_cache_key(self.tenant, self.sweep_id, f"{name}.json")

    def fail_key(self, name: str) -> str:
        return paths.report_cache_key(self.tenant, self.sweep_id, f"{name}{FAIL}.json")

    def listing(self) -> set[str]:
        """The file names in the cache: one listing (a round trip per 1,000 entries), not one per entry."""
        prefix = paths.report_cache_key(self.tenant, self.sweep_id, "")
        return {k.rsplit("/", 1)[1] for k in self.store.list(prefix)}

    @staticmethod
    def holds(listing: set[str], name: str) -> bool:
        return f"{name}.json" in listing

    @staticmethod
    def failed(listing: set[str], name: str) -> bool:
        return f"{name}{FAIL}.json" in listing

    def read(self, name: str) -> dict[str, Any] | None:
        """The entry's document; None where there is none or it is damaged (computed again)."""
        key = self.key(name)
        try:
            return self.store.read_json(key) if self.store.exists(key) else None
        except CorruptRecordError:
            return None

    def write(self, name: str, doc: dict[str, Any]) -> None:
        self.store.write_json(self.key(name), doc)

    def mark_failed(self, name: str, err: BaseException) -> None:
        """A report worker's failure mark: the first line of why, at most 300 characters."""
        reason = (str(err).splitlines() or [repr(err)])[0][:300]
        self.store.write_json(self.fail_key(name), {"reason": reason})

    def clear_failure(self, name: str) -> None:
        """An earlier attempt's mark, deleted before the task is asked for again."""
        self.store.delete(self.fail_key(name))

    def failure(self, name: str) -> str | None:
        with contextlib.suppress(Exception):
            return self.store.read_json(self.fail_key(name)).get("reason")
        return None

    def arrivals(self, names: list[str], *, stall_s: float, poll_s: float, what: str) -> Iterator[int]:
        """Poll the cache until every name's entry (or failure mark) is there, or nothing came into the cache for
        `stall_s` seconds (an entry awaited, or any other: a judge share's replies as it sends); yields how many
        are in as they come (what is still missing then, the caller computes)."""
        pending, marked, last, seen = set(names), [], time.monotonic(), -1
        while pending:
            t0 = time.monotonic()
            listing = self.listing()
            listed = time.monotonic() - t0
            ready = {n for n in pending if self.holds(listing, n)}
            failed = [n for n in sorted(pending - ready) if self.failed(listing, n)]
            if len(listing) > seen >= 0:  # the workers are writing (a judge share caches each reply): not stalled
                last = time.monotonic()
            seen = len(listing)
            if ready or failed:
                marked += failed
                pending -= ready | set(failed)
                last = time.monotonic()
                log.info(f"report.{what}_ready", ready=len(names) - len(pending), of=len(names))
                yield len(names) - len(pending)
            elif time.monotonic() - last > stall_s:
                late = f"{len(pending)} {what} did not come from the report workers within {stall_s:g} s"
                log.warning(f"report: {late}; computed here")
                break
            if pending:  # a listing grows with the cache (4,000 entries: ~30 ms from disk, 4 pages from S3)
                time.sleep(max(poll_s, listed / LIST_SHARE - listed))
        for name in marked:
            log.warning(
                f"report: a report worker could not compute a {what[:-1]} ({self.failure(name)}); computed here"
            )
