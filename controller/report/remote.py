"""The report's map over the cluster: one signed RQ job per cell (then per pair) missing from the cache.

    controller (report --distributed)          Redis                      report workers
    cells' digests, cache checked ──▶ signer ──▶ decodebench.<t>.report ──▶ run_report_cell
          ▲                        (server or operator)                       │ reads the cell's
          └──────── report/cache/<digest>.json in the store ◀─────────────────┘ records, streamed

- The signer (the submission server for a tenant's `report --distributed --api`, or the operator's
  own process with the signing key) enqueues one job per cell, `enqueue_cells`: its payload is the
  cell's digest (its cache key, `cells.digest`), its jobs with their generations' SHA-256, its row
  so far, the prompt order and the settings; signed like every job (`worker.core.signing`). The
  server builds the cells itself from the store (`enqueue_report`), never from what a tenant sends.
- A report worker (`decodebench report-worker`, controller.report.mapworker) runs
  `run_report_cell`: it reads the cell's results and records from ITS OWN store under the
  payload's tenant (the queue's tenant: anything else is refused before it runs), checks each
  result's hash against the payload, computes the cell as local mode does (`cells.run_cell`) and
  writes its output to the cache; a cell it cannot compute gets `<digest>.fail.json` instead.
- The controller waits for the cache entries (`wait_for_cells`, one store LIST per poll), then
  reduces as in local mode; what did not come (a failed or refused job, no report worker running
  within `stall_s`) is computed in the controller, with a warning line.
- Then the paired comparisons, the same way (`Dispatch.pairs`, `enqueue_pair_report`): one job per
  (cell, baseline) pair missing from the cache, planned by the signer from the store, its payload
  ids and settings only (controller.report.pairjobs); the worker reads both cells' cached outputs
  and writes `report/cache/pair-<digest>.json`, which the reduce reads as a local report's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import zlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import structlog

from controller.metrics import METRICS
from controller.metrics.extract import task_section
from controller.report import plancache
from controller.report.cells import DIGEST, MAX_N_BOOT, CellTask, Settings, cache_key, run_cell, to_json
from controller.report.jobs import job_reader, read_each
from controller.report.pairjobs import MAX_BASELINE, PAIR, pair_refusal, run_pair
from controller.report.speed import job_units, join_units
from worker.core import keys, paths, signing
from worker.core.errors import CorruptRecordError, PermanentJobError, UsageError

log = structlog.get_logger("decodebench.report")
LIST_SHARE = 0.1  # the controller's wait for report workers spends at most this share of its time listing
REPORT_TIMEOUT_S = 3600  # one cell's job at most
CHUNK = 500  # jobs per enqueue round trip

_store: ContextVar[Any] = ContextVar("decodebench_report_store", default=None)


@contextlib.contextmanager
def lend_store(store) -> Iterator[None]:
    """The report worker lends its own store to the job it runs (never a URL from the payload)."""
    token = _store.set(store)
    try:
        yield
    finally:
        _store.reset(token)


def job_id_of(digest: str) -> str:
    return f"cell-{digest}"


def fail_key(tenant: str, sweep_id: str, digest: str) -> str:
    return paths.report_key(tenant, sweep_id, f"cache/{digest}.fail.json")


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def payload(tenant: str, sweep_id: str, task: CellTask, settings: Settings, digest: str) -> dict[str, Any]:
    """What a report job carries: enough to rebuild the cell's task from the store, no records."""
    return {
        "tenant": tenant,
        "sweep_id": sweep_id,
        "cell": task.cell,
        "digest": digest,
        "jobs": sorted([job_id, sha] for job_id, sha in task.jobs),
        "row": {k: _plain(v) for k, v in task.row.items()},
        "prompt_rank": task.prompt_rank,
        "units": task.units,
        "settings": dataclasses.asdict(settings),
    }


# -- the signer's side -------------------------------------------------------------------------


def enqueue_cells(conn, key: bytes, tenant: str, sweep_id: str, items: list[tuple[CellTask, str]], settings,
                  admission: Admission | None = None) -> int:  # fmt: skip
    """One signed job per (task, digest) on the tenant's report queue, except those already queued or
    running (a second report of the same sweep waits for the same jobs); how many jobs were written."""
    jobs = [(job_id_of(d), f"cell {task.cell}", {"cell": task.cell}, payload(tenant, sweep_id, task, settings, d))
            for task, d in items]  # fmt: skip
    return _enqueue(conn, key, tenant, sweep_id, jobs, admission or Admission())


@dataclasses.dataclass
class Admission:
    """The server's hold on a tenant's report jobs: `lock()` is held from reading which jobs are queued
    until the new ones are written (never while the sweep is planned), and `check(n)` refuses n new jobs
    over the quota before any is written. The operator's own process: no lock, no quota."""

    lock: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    check: Callable[[int], None] = lambda n: None


def _enqueue(conn, key: bytes, tenant: str, sweep_id: str, jobs: list[tuple[str, str, dict, dict]],
             admission: Admission) -> int:  # fmt: skip
    """One signed job per (job id, what, meta, payload) on the tenant's report queue, but none for a job
    id already queued or running; how many were written."""
    from worker.core import rqadapter

    queue = rqadapter.tenant_queue(conn, keys.report_queue(tenant), tenant)
    template = rqadapter.job_template(queue, keys.REPORT_FUNCTION, None, keys.RESULT_TTL, keys.FAILURE_TTL)
    with admission.lock():
        statuses = rqadapter.job_statuses(conn, tenant, [j[0] for j in jobs]) if jobs else []
        rows = []
        for (job_id, what, meta, doc), status in zip(jobs, statuses):
            if status in ("queued", "started"):
                continue  # waited for as it is
            stored = zlib.compress(rqadapter.call_data(keys.REPORT_FUNCTION, json.dumps(doc).encode()), 1)
            fields = {
                "data": stored,
                "description": f"decodebench report {what}"[:200],
                "meta": rqadapter.meta_field({"tenant": tenant, "sweep_id": sweep_id, **meta}),
                "timeout": REPORT_TIMEOUT_S,
                signing.SIG_FIELD: signing.sign(key, tenant, job_id, stored),
            }
            rows.append((job_id, fields))
        if rows:
            admission.check(len(rows))
        for i in range(0, len(rows), CHUNK):
            rqadapter.bulk_enqueue(conn, queue, template, rows[i : i + CHUNK])
    return len(rows)


def _bounded(n_boot: int, n_boot_corpus: int) -> None:
    if not 0 <= n_boot <= MAX_N_BOOT or not 0 <= n_boot_corpus <= MAX_N_BOOT:
        raise UsageError(f"n_boot: at most {MAX_N_BOOT:,} replicates")


def enqueue_report(conn, store, key: bytes, tenant: str, sweep_id: str, *, n_boot: int, seed: int,
                   n_boot_corpus: int, admission: Admission | None = None,
                   memo: plancache.PlanMemo | None = None) -> dict[str, Any]:  # fmt: skip
    """The submission server's side of `report --distributed --api`: the tenant's own sweep read from
    the store (results only), its cells planned as `summarize` plans them, and a job enqueued for each
    cell missing from the cache. What the client waits for: the digests (cache keys). With `memo`
    (controller.report.plancache): a sweep unchanged since it was planned, whose cells are all cached,
    is answered from the memo without reading its results; a plan read is remembered for the pairs."""
    _bounded(n_boot, n_boot_corpus)
    found = plancache.lookup(memo, store, tenant, sweep_id, n_boot, seed, n_boot_corpus)
    cached = {k.rsplit("/", 1)[1] for k in store.list(paths.report_key(tenant, sweep_id, "cache/"))}
    if found.basis is not None and all(d is None or f"{d}.json" in cached for d in found.basis.digests.values()):
        return {"tenant": tenant, "sweep_id": sweep_id, "cells": len(found.basis.cells), "missing": 0,
                "enqueued": 0, "digests": []}  # fmt: skip
    tasks, basis = found.plan()
    settings, digests = basis.settings, basis.digests
    missing = []
    for task in tasks:
        d = digests[task.cell]
        if d is not None and f"{d}.json" not in cached:
            missing.append((task, d))
            if f"{d}.fail.json" in cached:  # an earlier attempt's mark: this one starts afresh
                store.delete(fail_key(tenant, sweep_id, d))
    enqueued = enqueue_cells(conn, key, tenant, sweep_id, missing, settings, admission)
    return {"tenant": tenant, "sweep_id": sweep_id, "cells": len(tasks), "missing": len(missing),
            "enqueued": enqueued, "digests": [d for _, d in missing]}  # fmt: skip


def enqueue_pair_report(conn, store, key: bytes, tenant: str, sweep_id: str, *, n_boot: int, seed: int,
                        n_boot_corpus: int, baseline: str | None, admission: Admission | None = None,
                        memo: plancache.PlanMemo | None = None) -> dict[str, Any]:  # fmt: skip
    """The signer's side of the paired comparisons (`report --distributed`, after the cells): the tenant's
    own sweep's pairs planned from the store (controller.report.pairjobs.plan_pairs; with `memo`, from
    the cells' plan when the sweep has not changed since), one job for each missing from the cache
    whose cells are cached. What the client waits for: the pairs' digests."""
    from controller.report.pairjobs import plan_pairs

    _bounded(n_boot, n_boot_corpus)
    total, docs = plan_pairs(store, tenant, sweep_id, n_boot=n_boot, seed=seed, n_boot_corpus=n_boot_corpus,
                             baseline=baseline, memo=memo)  # fmt: skip
    jobs = [(f"pair-{d['pair']}", f"pair {d['pair']}", {"pair": d["pair"]}, d) for d in docs]
    enqueued = _enqueue(conn, key, tenant, sweep_id, jobs, admission or Admission())
    return {"tenant": tenant, "sweep_id": sweep_id, "pairs": total, "missing": len(docs), "enqueued": enqueued,
            "names": [d["pair"] for d in docs]}  # fmt: skip


def wait_for_cells(store, tenant: str, sweep_id: str, digests: list[str], *, stall_s: float, poll_s: float = 0.5,
                   what: str = "cells", on_ready=None):  # fmt: skip
    """Poll the cache until every digest's output (or failure mark) is there, or none came for
    `stall_s` seconds; the digests still missing (the caller computes them). A pair's digest is given
    as `pair-<digest>`, its entries' names. `on_ready(n)`: called with how many are in as they come."""
    prefix = paths.report_key(tenant, sweep_id, "cache/")
    pending, failed, last = set(digests), [], time.monotonic()
    while pending:
        t0 = time.monotonic()
        names = {k.rsplit("/", 1)[1] for k in store.list(prefix)}
        listed = time.monotonic() - t0
        ready = {d for d in pending if f"{d}.json" in names}
        marked = [d for d in pending - ready if f"{d}.fail.json" in names]
        if ready or marked:
            failed += marked
            pending -= ready | set(marked)
            last = time.monotonic()
            log.info(f"report.{what}_ready", ready=len(digests) - len(pending), of=len(digests))
            if on_ready is not None:
                on_ready(len(digests) - len(pending))
        elif time.monotonic() - last > stall_s:
            log.warning(f"report: {len(pending)} {what} did not come from the report workers within {stall_s:g} s; "
                        "computed here")  # fmt: skip
            break
        if pending:  # a listing grows with the cache (4,000 entries: ~30 ms from disk, 4 pages from S3)
            time.sleep(max(poll_s, listed / LIST_SHARE - listed))
    for d in failed:
        with contextlib.suppress(Exception):
            reason = store.read_json(fail_key(tenant, sweep_id, d)).get("reason")
            log.warning(f"report: a report worker could not compute a {what[:-1]} ({reason}); computed here")
    return sorted(pending) + failed


class Dispatch:
    """`map_cells`' remote: the cells missing from the cache asked of the signer (`ask(sweep_id, body)`,
    a backend's `report_cells`: the submission server, or the operator's own process), then waited for
    in the cache; and `pair_memo`'s: the pairs, likewise (`ask_pairs`, a backend's `report_pairs`;
    None: the pairs are computed here). `sent`/`sent_pairs`: what the signer has jobs for;
    `left`/`left_pairs`: what did not come. `on_ready(n)`, where given: how many have come so far."""

    def __init__(self, ask, store, *, ask_pairs=None, stall_s: float = 300.0, poll_s: float = 0.5) -> None:
        self.ask, self.ask_pairs, self.store, self.stall_s, self.poll_s = ask, ask_pairs, store, stall_s, poll_s
        self.sent: list[str] = []
        self.left: list[str] = []
        self.sent_pairs: list[str] = []
        self.left_pairs: list[str] = []

    def __call__(self, items: list[tuple[CellTask, str]], settings: Settings, on_ready=None) -> None:
        if not items:
            return
        _, tenant, sweep_id = items[0][0].where  # type: ignore[misc]
        body = {"n_boot": settings.n_boot, "n_boot_corpus": settings.n_boot_corpus, "seed": settings.seed}
        asked = set(self.ask(sweep_id, body).get("digests") or [])
        self.sent = [d for _, d in items if d in asked]
        log.info("report.cells_enqueued", cells=len(self.sent), computed_here=len(items) - len(self.sent))
        self.left = wait_for_cells(self.store, tenant, sweep_id, self.sent, stall_s=self.stall_s, poll_s=self.poll_s,
                                   on_ready=on_ready)  # fmt: skip

    def pairs(self, pair_keys: list[str], settings: Settings, baseline: str | None, on_ready=None) -> None:
        """The pairs whose cache keys (`paircache.pair_key`) are given, asked of the signer and waited for."""
        if not pair_keys or self.ask_pairs is None:
            return
        if baseline is not None and (len(baseline) > MAX_BASELINE or not baseline.isprintable()):
            log.warning(f"report: a baseline of over {MAX_BASELINE} characters, or with control characters, is "
                        "not sent to the signer; the pairs are computed here")  # fmt: skip
            return
        tenant, _, sweep_id = pair_keys[0].split("/")[:3]  # <tenant>/sweeps/<sweep>/report/cache/pair-<d>.json
        body = {"n_boot": settings.n_boot, "n_boot_corpus": settings.n_boot_corpus, "seed": settings.seed,
                "baseline": baseline}  # fmt: skip
        asked = {f"pair-{n}" for n in self.ask_pairs(sweep_id, body).get("names") or []}
        wanted = [k.rsplit("/", 1)[1].removesuffix(".json") for k in pair_keys]
        self.sent_pairs = [n for n in wanted if n in asked]
        log.info("report.pairs_enqueued", pairs=len(self.sent_pairs), computed_here=len(wanted) - len(self.sent_pairs))
        self.left_pairs = wait_for_cells(self.store, tenant, sweep_id, self.sent_pairs, stall_s=self.stall_s,
                                         poll_s=self.poll_s, what="pairs", on_ready=on_ready)  # fmt: skip


# -- the report worker's side ------------------------------------------------------------------


def settings_of(doc: Any) -> Settings:
    """The payload's settings, checked: known metrics, bounded replicates."""
    if not isinstance(doc, dict):
        raise PermanentJobError("refused: the report job's settings are not an object")
    try:
        s = Settings(**doc)
        s.names = tuple(s.names)
    except TypeError as err:
        raise PermanentJobError(f"refused: the report job's settings: {err}") from None
    unknown = [n for n in s.names if n not in METRICS]
    if unknown:
        raise PermanentJobError(f"refused: unknown metric {unknown[0]!r} in the report job")
    if s.task is not None and task_section(s.task) != s.task:
        raise PermanentJobError("refused: the report job's task section is not valid")
    for name in ("n_boot", "n_boot_corpus", "seed"):
        v = getattr(s, name)
        if type(v) is not int or not 0 <= v <= (MAX_N_BOOT if name != "seed" else 2**63):
            raise PermanentJobError(f"refused: the report job's {name} is out of bounds")
    return s


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
    if "kind" in doc:  # a pair's job; a cell's payload has no kind
        if doc["kind"] != PAIR:
            return f"refused: the report job's kind {str(doc['kind'])[:32]!r} is not {PAIR!r}"
        return pair_refusal(doc, tenant)
    if not isinstance(doc.get("digest"), str) or not DIGEST.fullmatch(doc["digest"]):
        return "refused: the report job's digest is not a cache key"
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not jobs or not all(isinstance(j, list) and len(j) == 2 for j in jobs):
        return "refused: the report job names no jobs"
    if not isinstance(doc.get("row"), dict) or not isinstance(doc.get("prompt_rank"), dict):
        return "refused: the report job's row or prompt order is not an object"
    units = doc.get("units")
    if not isinstance(units, list) or not all(isinstance(u, list) and len(u) == 2 for u in units):
        return "refused: the report job's batch units are not [tokens, seconds] pairs"
    try:
        settings_of(doc.get("settings"))
    except PermanentJobError as err:
        return str(err)
    return None


def checked_units(store, tenant: str, sweep_id: str, cell: str, jobs: list[tuple[str, str]]) -> list[list[float]]:
    """The cell's batch units (speed.batch_units) from the jobs' results in the worker's own store, each
    result checked to be the one the report was asked for (its cell, tenant and generations' hash)."""
    read = job_reader(store, tenant, sweep_id, with_generations=False)  # S3: several in flight, as at load
    per_job = []
    for (job_id, sha), loaded in zip(jobs, read_each(read, [j for j, _ in jobs], store.read_concurrency)):
        if isinstance(loaded, CorruptRecordError):
            raise loaded
        r = loaded[0]  # checked, then let go: the map needs its id, hash and batch units
        if r.job.cell != cell or r.generations_sha256 != sha or r.job.tenant != tenant:
            raise PermanentJobError(f"job {job_id} changed since the report was asked for; report again")
        per_job.append(job_units(r))
    return join_units(per_job)


def run_report_cell(doc: dict) -> dict[str, Any]:
    """What RQ calls for a job of a report queue (`keys.REPORT_FUNCTION`): compute one cell (or, for
    `kind: "pair"`, one pair: controller.report.pairjobs) from the worker's own store and write its
    output to the cache (or its failure mark)."""
    store = _store.get()
    if store is None:
        raise PermanentJobError("run_report_cell runs inside decodebench report-worker, which lends it a store")
    if doc.get("kind") == PAIR:
        return run_pair(store, doc)
    tenant, sweep_id, digest = doc["tenant"], doc["sweep_id"], doc["digest"]
    try:
        settings = settings_of(doc["settings"])
        jobs = [(paths.check_id("job", job_id), sha) for job_id, sha in doc["jobs"]]
        units = checked_units(store, tenant, sweep_id, doc["cell"], jobs)
        if units != doc["units"]:  # what the digest was computed over
            raise PermanentJobError("a job's timings changed since the report was asked for; report again")
        where = (store.url, tenant, sweep_id)
        task = CellTask(doc["cell"], doc["row"], jobs, doc["prompt_rank"], None, where, units)
        out = run_cell(task, [(n, METRICS.get(n)) for n in settings.names], settings)
        if out.damaged:
            raise PermanentJobError(out.damaged[0])
    except Exception as err:
        store.write_json(fail_key(tenant, sweep_id, digest), {"reason": str(err).splitlines()[0][:300]})
        raise
    store.write_json(cache_key(tenant, sweep_id, digest), to_json(out))
    return {"cell": doc["cell"], "digest": digest, "generations": out.row.get("n_generations")}
