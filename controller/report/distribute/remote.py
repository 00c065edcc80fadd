"""The runner's third backend: report tasks computed by the cluster's report workers (`report --distributed`).

    controller (report --distributed)          Redis                      report workers
    tasks missing from the cache ──▶ signer ──▶ decodebench.<t>.report ──▶ run_report_task
          ▲                       (server or operator)                        │ reads what the task
          └────────── report/cache/<name>.json in the store ◀─────────────────┘ needs, from its store

The controller never sends a task itself: it asks the signer (a backend's `report_cells`, `report_pairs`
or `report_judges`, controller.cli.backend: the submission server for a tenant, or the operator's own
process) to plan the tasks of that kind from the store and enqueue those missing from the cache
(controller.report.distribute.signer), then waits for their entries in the cache. Whatever did not
come (a failed or refused job, no report worker running within `stall_s`) the runner computes here.
"""

from __future__ import annotations

from collections.abc import Iterator

import structlog

from controller.report.compute.cache import ReportCache
from controller.report.compute.tasks import ReportTask

log = structlog.get_logger("decodebench.report")


class ReportWorkers:
    """The report workers behind a signer: `signer` has `report_cells(sweep, body)`, `report_pairs(sweep, body)` and
    `report_judges(sweep, body)` (controller.cli.backend), `store` is where the cache is read, `stall_s` how long
    to wait with nothing coming."""

    def __init__(self, signer, *, stall_s: float = 300.0, poll_s: float = 0.5) -> None:
        self.signer, self.stall_s, self.poll_s = signer, stall_s, poll_s

    def compute(self, tasks: list[ReportTask], cache: ReportCache, what: str) -> Iterator[int]:
        """Ask the signer for these tasks (all of one kind), then wait for their entries; yields how many have come."""
        request = tasks[0].request()
        if request is None:
            return
        sweep_id, body = request
        asked = tasks[0].answered(getattr(self.signer, tasks[0].signer_call)(sweep_id, body))
        sent = [task.name for task in tasks if task.name in asked]
        log.info(f"report.{what}_enqueued", **{what: len(sent)}, computed_here=len(tasks) - len(sent))
        yield from cache.arrivals(sent, stall_s=self.stall_s, poll_s=self.poll_s, what=what)  # type: ignore[arg-type]
