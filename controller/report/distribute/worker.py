"""What a report worker runs for a job of a tenant's report queue: one report task, from its own store.

`decodebench report-worker` (controller.report.distribute.mapworker) takes only report queues, checks
each job's signature, then its payload (`check_payload`: for the queue's own tenant, a sweep id, then
the task kind's own checks, controller.report.compute.tasks) and runs `run_report_task` with its own
store lent (`lend_store`), never a URL from the payload. The task is rebuilt from that store and
checked against the payload (`from_payload`), run as local mode runs it, and its output written to the
report cache, or, where it cannot be computed, its failure mark, which the controller reads as
"compute it here". A judge share (controller.judge.jobs) sends its requests from here: the endpoint its
payload names resolves in this worker's own tenants file, for a tenant that may use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from controller.judge.jobs import JudgeJob
from controller.report.compute.cache import ReportCache
from controller.report.compute.celljob import CellJob
from controller.report.compute.pairs import PairJob
from worker.core import paths
from worker.core.errors import PermanentJobError, UsageError

Kind = type[CellJob] | type[PairJob] | type[JudgeJob]
KINDS: dict[str, Kind] = {"cell": CellJob, "pair": PairJob, "judge": JudgeJob}  # a cell's payload has no kind

_store: ContextVar[Any] = ContextVar("decodebench_report_store", default=None)


@contextlib.contextmanager
def lend_store(store) -> Iterator[None]:
    """The report worker lends its own store to the job it runs (never a URL from the payload)."""
    token = _store.set(store)
    try:
        yield
    finally:
        _store.reset(token)


def _kind(doc: dict[str, Any]) -> Kind:
    return KINDS[doc.get("kind", "cell")]


def check_payload(doc: Any, tenant: str) -> str | None:
    """Why a report job taken from `tenant`'s report queue must not run (its payload, signed, is still
    checked as the tenant's word), or None."""
    if not isinstance(doc, dict):
        return "refused: the report job's argument is not one object"
    if doc.get("tenant") != tenant:
        other = str(doc.get("tenant"))[:64]
        return f"refused: a report job of tenant {other!r} on the report queue of tenant {tenant!r}"
    try:
        paths.check_id("sweep", doc.get("sweep_id"))
    except (UsageError, TypeError, ValueError):
        return "refused: the report job's sweep id is not a sweep id"
    if "kind" in doc and (doc["kind"] == CellJob.kind or doc["kind"] not in KINDS):  # a cell's payload has no kind
        return f"refused: the report job's kind {str(doc['kind'])[:32]!r} is not 'pair' or 'judge'"
    return _kind(doc).refusal(doc, tenant)


def run_report_task(doc: dict) -> dict[str, Any]:
    """What RQ calls for a job of a report queue (`keys.REPORT_FUNCTION`): one report task (a cell's, for
    `kind: "pair"` a pair's, for `kind: "judge"` a share of the judge's requests, sent from here) from the
    worker's own store, its output written to the cache (or its failure mark)."""
    store = _store.get()
    if store is None:
        raise PermanentJobError("run_report_task runs inside decodebench report-worker, which lends it a store")
    kind = _kind(doc)
    cache = ReportCache(store, doc["tenant"], doc["sweep_id"])
    name = kind.prefix + doc[kind.digest_field]
    try:
        task = kind.from_payload(doc, store)
        entry = task.entry(task.run())  # type: ignore[arg-type]
    except Exception as err:
        cache.mark_failed(name, err)
        raise
    cache.write(name, entry)
    return {"kind": kind.kind, "entry": name, "label": task.label}
