"""The signer's side of `report --distributed`: the tenant's report tasks planned from the store, signed, enqueued.

The signer is the submission server for a tenant's `report --distributed --api`, or the operator's own
process with the signing key. It never takes tasks from the client: it plans the sweep's cells as
`summarize` plans them (the same digests; with a `PlanMemo`, controller.report.distribute.plancache,
from the last plan when the sweep has not changed since), then the pairs from the cells, then the
judge's shares from the stored spec and generations (controller.judge.jobs), and
enqueues one signed job per task missing from the cache on the tenant's report queue, each calling
`keys.REPORT_FUNCTION` (controller.report.distribute.worker.run_report_task) with the task's payload.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from controller.report.compute.cache import ReportCache
from controller.report.compute.celljob import CellJob
from controller.report.compute.pairs import PairJob
from controller.report.compute.tasks import MAX_N_BOOT, ReportTask
from controller.report.distribute import plancache
from controller.report.stats.cellstats import CellStats
from controller.report.stats.paired import baselines
from worker.core import keys, signing
from worker.core.errors import UsageError

if TYPE_CHECKING:
    from controller.judge.jobs import JudgeJob

REPORT_TIMEOUT_S = 3600  # one report job at most
CHUNK = 500  # jobs per enqueue round trip


@dataclasses.dataclass
class Admission:
    """The server's hold on a tenant's report jobs: `lock()` is held from reading which jobs are queued
    until the new ones are written (never while the sweep is planned), and `check(n)` refuses n new jobs
    over the quota before any is written. The operator's own process: no lock, no quota."""

    lock: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    check: Callable[[int], None] = lambda n: None


def job_id_of(task: ReportTask) -> str:
    """A report job's RQ id: its kind and digest (a second report of the same sweep finds the same job)."""
    return f"{task.kind}-{task.digest}"


def enqueue(conn, key: bytes, tenant: str, sweep_id: str, tasks: list[ReportTask], admission: Admission) -> int:
    """One signed job per task on the tenant's report queue, but none for a task already queued or running
    (a second report of the same sweep waits for the same jobs); how many were written."""
    from worker.core import rqadapter

    queue = rqadapter.tenant_queue(conn, keys.report_queue(tenant), tenant)
    template = rqadapter.job_template(queue, keys.REPORT_FUNCTION, None, keys.RESULT_TTL, keys.FAILURE_TTL)
    with admission.lock():
        statuses = rqadapter.job_statuses(conn, tenant, [job_id_of(t) for t in tasks]) if tasks else []
        rows = []
        for task, status in zip(tasks, statuses):
            if status in ("queued", "started"):
                continue  # waited for as it is
            stored = zlib.compress(rqadapter.call_data(keys.REPORT_FUNCTION, json.dumps(task.payload()).encode()), 1)
            fields = {
                "data": stored,
                "description": f"decodebench report {task.kind} {task.label}"[:200],
                "meta": rqadapter.meta_field({"tenant": tenant, "sweep_id": sweep_id, task.kind: task.label}),
                "timeout": REPORT_TIMEOUT_S,
                signing.SIG_FIELD: signing.sign(key, tenant, job_id_of(task), stored),
            }
            rows.append((job_id_of(task), fields))
        if rows:
            admission.check(len(rows))
        for i in range(0, len(rows), CHUNK):
            rqadapter.bulk_enqueue(conn, queue, template, rows[i : i + CHUNK])
    return len(rows)


def _bounded(n_boot: int, n_boot_corpus: int) -> None:
    if not 0 <= n_boot <= MAX_N_BOOT or not 0 <= n_boot_corpus <= MAX_N_BOOT:
        raise UsageError(f"n_boot: at most {MAX_N_BOOT:,} replicates")


def _missing(cache: ReportCache, listing: set[str], tasks: list[ReportTask]) -> list[ReportTask]:
    """The tasks whose entries the cache lacks; an earlier attempt's failure mark is cleared (a fresh start)."""
    missing = [t for t in tasks if t.name is not None and not cache.holds(listing, t.name)]
    for task in missing:
        if cache.failed(listing, task.name):  # type: ignore[arg-type]
            cache.clear_failure(task.name)  # type: ignore[arg-type]
    return missing


def plan_cells(
    store, tenant: str, sweep_id: str, *, n_boot: int, seed: int, n_boot_corpus: int, memo=None
) -> tuple[int, list[CellJob]]:
    """The sweep's cells (how many), and the jobs of those missing from the cache, planned as `summarize`
    plans them from the store (results only). With `memo`: a sweep unchanged since it was planned, whose
    cells are all cached, is answered from the memo without reading its results; a plan read is
    remembered for the pairs."""
    found = plancache.lookup(memo, store, tenant, sweep_id, n_boot, seed, n_boot_corpus)
    cache = ReportCache(store, tenant, sweep_id)
    listing = cache.listing()
    if found.basis is not None and all(d is None or cache.holds(listing, d) for d in found.basis.digests.values()):
        return len(found.basis.cells), []
    tasks, basis = found.plan()
    jobs = [CellJob(task, basis.settings, digest=basis.digests[task.cell]) for task in tasks]
    return len(tasks), _missing(cache, listing, jobs)  # type: ignore[arg-type,return-value]


def plan_pairs(
    store,
    tenant: str,
    sweep_id: str,
    *,
    n_boot: int,
    seed: int,
    n_boot_corpus: int,
    baseline: str | None,
    memo: plancache.PlanMemo | None = None,
) -> tuple[int, list[PairJob]]:
    """The sweep's compared pairs (how many), and the jobs of those missing from the cache whose two cells
    are both cached (a pair with a cell not cached is left to the controller). Planned from the store only:
    the cells as `summarize` plans them (with `memo`, as the cells' call planned them if the sweep's
    fingerprint has not changed since: no result.json read), each compared with the baseline
    `paired.baselines` gives it (from the cells' keys, models and strategies, as in the reduce)."""
    found = plancache.lookup(memo, store, tenant, sweep_id, n_boot, seed, n_boot_corpus)
    basis = found.basis or found.plan()[1]
    settings = basis.settings
    if not settings.with_ci:  # no intervals, no comparisons
        return 0, []
    digests = basis.digests
    cells = [CellStats(cell, model, strategy, [], {}) for cell, model, strategy, _ in basis.cells]
    pairs = [(c, b) for c, b in baselines(cells, baseline).items() if b is not None]
    cache = ReportCache(store, tenant, sweep_id)
    listing = cache.listing()
    jobs: list[ReportTask] = []
    for c, b in pairs:
        if all(d is not None and cache.holds(listing, d) for d in (digests[c], digests[b])):
            settled = (settings.names, n_boot, seed, baseline, cache, (digests[c], digests[b]))
            jobs.append(PairJob(*settled))  # its cells are read by the report worker
    return len(pairs), _missing(cache, listing, jobs)  # type: ignore[return-value]


def plan_judges(store, tenant: str, sweep_id: str, tenants=None) -> tuple[int, list[JudgeJob]]:
    """The sweep's judge shares (how many), and those with a request missing from the cache, planned from the
    store as the report plans them (controller.judge.run.plan_sweep: its stored judge, all its generations:
    a share is the requests of whole cells, controller.judge.jobs.cut, so its worker reads only those), after
    the whole report's budget is checked (UsageError: over `limits.max_requests` or `max_tokens`). Only a
    declared endpoint's requests go to the report workers; with `tenants` (the server's), the tenant must
    still be allowed that endpoint. A missing share's earlier entry is stale (a reply left the cache): deleted."""
    import time

    from controller.judge.jobs import judge_jobs, remote_shares, shares_plan  # the cells' and pairs' import none
    from controller.judge.run import check_budget, plan_sweep

    judge, _, items, plan = plan_sweep(store, tenant, sweep_id)
    if judge is None or judge.endpoint is None:
        return 0, []
    if tenants is not None:
        policy = tenants.get(tenant)
        if tenants.judge(judge.endpoint) is None or policy is None or judge.endpoint not in policy.judges:
            raise UsageError(f"judge.endpoint: tenant {tenant!r} may not use judge endpoint {judge.endpoint!r}")
    cache = ReportCache(store, tenant, sweep_id)
    shares = remote_shares(judge, items)
    jobs = judge_jobs(judge, items, cache, shares=shares, deadline=time.time() + judge.limits.time_budget_s)
    check_budget(shares_plan(jobs, plan.cached), judge.limits)
    missing = [job for job in jobs if any(r.digest not in plan.cached for r in job.requests)]
    listing = cache.listing()
    for job in missing:
        if cache.holds(listing, job.name):
            store.delete(cache.key(job.name))
    return len(jobs), _missing(cache, cache.listing(), missing)  # type: ignore[arg-type,return-value]


def enqueue_report(
    conn,
    store,
    key: bytes,
    tenant: str,
    sweep_id: str,
    *,
    pairs: bool = False,
    judges: bool = False,
    n_boot: int = 0,
    seed: int = 0,
    n_boot_corpus: int = 0,
    baseline: str | None = None,
    admission: Admission | None = None,
    memo: plancache.PlanMemo | None = None,
    tenants=None,
) -> dict[str, Any]:
    """The signer's side of `report --distributed`: the tenant's own sweep's cells (`plan_cells`) or, with
    `pairs`, after the cells, its pairs (`plan_pairs`, compared with `baseline`), or, with `judges`, its judge
    requests' shares (`plan_judges`), and a signed job for each missing from the cache. What the client waits
    for: their digests (`digests` for the cells, `names` for the pairs and shares: the entries `pair-<name>`,
    `judgeshare-<name>`)."""
    if judges:
        total, shares = plan_judges(store, tenant, sweep_id, tenants)
        enqueued = enqueue(conn, key, tenant, sweep_id, shares, admission or Admission())  # type: ignore[arg-type]
        counts = {"judges": total, "missing": len(shares), "enqueued": enqueued}
        return {"tenant": tenant, "sweep_id": sweep_id, **counts, "names": [s.digest for s in shares]}
    _bounded(n_boot, n_boot_corpus)
    settings = {"n_boot": n_boot, "seed": seed, "n_boot_corpus": n_boot_corpus, "memo": memo}
    if pairs:
        total, jobs = plan_pairs(store, tenant, sweep_id, baseline=baseline, **settings)
    else:
        total, jobs = plan_cells(store, tenant, sweep_id, **settings)  # type: ignore[assignment]
    enqueued = enqueue(conn, key, tenant, sweep_id, jobs, admission or Admission())  # type: ignore[arg-type]
    digests = [job.digest for job in jobs]
    counts = {"pairs" if pairs else "cells": total, "missing": len(jobs), "enqueued": enqueued}
    return {"tenant": tenant, "sweep_id": sweep_id, **counts, "names" if pairs else "digests": digests}
