"""A sweep as the report loads it: its spec and its complete jobs, each read once (`load_sweep`).

`load_sweep` reads the spec, the plan and every complete job's result (with its generations, or
without them: each kept as a compact JobInfo, controller.report.load.jobs, a result unchanged since
the last such load taken from the sweep's snapshot, controller.report.load.snapshot), in job-id order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.report.load import snapshot
from controller.report.load.jobs import Compactor, JobInfo, check_model_files, check_plugins, prompts_of
from controller.sweep.labels import key_labels
from controller.sweep.load import inner_spec
from worker.core.contract import PromptItem
from worker.core.errors import CorruptRecordError
from worker.core.results import GenerationRecord, JobResult
from worker.store import Store

MISSING_SHOWN = 8  # missing cells named in a header; the rest counted
Tick = Callable[[str, int, int], None]  # progress(what, done, total): "results", "cells", "pairs"


@dataclass
class SweepData:
    """Everything the report needs of one sweep: its spec and its complete jobs (JobResults, or JobInfos)."""

    tenant: str
    sweep_id: str
    spec: dict[str, Any]
    results: list[JobResult | JobInfo]
    generations: list[GenerationRecord]
    planned_jobs: int | None = None
    prompts: list[PromptItem] = field(default_factory=list)
    cell_order: list[str] = field(default_factory=list)  # cells in plan order, where known
    damaged: list[str] = field(default_factory=list)  # one line per damaged record left out (a job, spec, plan)
    loaded: bool = True  # False: loaded without generations; each cell's are read when it is aggregated
    examples: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (cell, prompt) -> first seed's

    def __post_init__(self) -> None:
        if not self.prompts:
            self.prompts = prompts_of(self.results)

    @property
    def sweep_spec(self) -> dict[str, Any]:
        """The sweep spec itself (spec.json wraps it with the sweep's metadata)."""
        return inner_spec(self.spec)

    @property
    def n_generations(self) -> int:
        """Generations of the complete jobs (one per prompt of each job when they were not loaded)."""
        return len(self.generations) if self.loaded else sum(len(r.job.prompts) for r in self.results)

    @property
    def name(self) -> str:
        return str((self.spec or {}).get("name") or self.sweep_spec.get("name") or "")

    @property
    def missing_cells(self) -> list[str]:
        """The planned cells without one complete job, in plan order: not in the report at all."""
        done = {r.job.cell for r in self.results}
        return [cell for cell in self.cell_order if cell not in done]

    def completeness(self) -> str:
        """'N complete job(s) of M' (every format's header)."""
        return f"{len(self.results)} complete job(s)" + (f" of {self.planned_jobs}" if self.planned_jobs else "")

    def missing_note(self) -> str:
        """The sentence naming the planned cells without one complete job, which no table shows ('' if none)."""
        missing = self.missing_cells
        if not missing:
            return ""
        labels = dict(zip(self.cell_order, key_labels(self.cell_order)))  # as every other view names them
        more = len(missing) - MISSING_SHOWN
        shown = ", ".join(labels[c] for c in missing[:MISSING_SHOWN]) + (f" and {more} more" if more > 0 else "")
        return f"Not in this report (no complete job yet): {shown}."

    def incomplete_note(self) -> str | None:
        """The terminal's line where jobs of the plan have no result yet (running, failed or never run), else None."""
        if not self.planned_jobs or len(self.results) >= self.planned_jobs:
            return None
        return (
            f"note: {self.completeness()}: the others are still running, failed or were never run (a local run: "
            f"`decodebench run SPEC` again resumes and names failures; submitted: `decodebench status "
            f"{self.sweep_id}`). {self.missing_note()}"
        ).rstrip()


def load_sweep(
    store: Store,
    tenant: str,
    sweep_id: str,
    *,
    with_generations: bool = True,
    progress: Tick | None = None,
    versions: Mapping[str, str] | None = None,
) -> SweepData:
    """Read the spec and every COMPLETE job (result.json present); each generation once. The jobs are
    read the store's `read_concurrency` at a time (S3: 16 round trips in flight), kept in job-id order.

    `with_generations=False` reads the results only, each kept as a compact JobInfo (report.jobs):
    `summarize(..., store=store)` streams each cell's generations when it aggregates that cell (and
    names a damaged one), so the report never holds every record, nor every whole result, at once;
    a result unchanged since the last such load comes from the sweep's snapshot (report.snapshot).
    `versions`: the version tags of the sweep's keys, where the caller has listed them (plancache).

    A damaged record (a worker killed mid-write, a hand edit) is named in one warning line
    and left out, as if missing: a job's, or the sweep's spec.json or plan.json (the report
    is then built from the jobs' own specs, in the spec's or the jobs' order). A model whose complete jobs ran on
    different files, or a plugin strategy whose complete jobs ran different versions of its plugin, is a UsageError
    (`jobs.check_model_files`, `jobs.check_plugins`)."""
    log = structlog.get_logger("decodebench.report")
    damaged: list[str] = []
    spec = _or_damaged(lambda: store.load_spec(tenant, sweep_id), "the sweep's spec", damaged, {})
    results: list[JobResult | JobInfo] = []
    generations: list[GenerationRecord] = []
    seen: set[tuple[str, str, int]] = set()
    compact = Compactor()
    job_ids, each = snapshot.complete_jobs(store, tenant, sweep_id, with_generations, versions)
    tick = progress or (lambda what, done, total: None)
    for done, (job_id, loaded) in enumerate(each, 1):  # to its end: the snapshot is written after the last
        tick("results", done, len(job_ids))
        if isinstance(loaded, CorruptRecordError):  # a damaged job (a worker killed mid-write, a hand edit)
            log.warning(f"{loaded}; job left out of the report")
            damaged.append(str(loaded))
            continue
        result, records = loaded
        results.append(result if with_generations else compact(result))
        for record in records:
            key = (job_id, record.prompt_id, record.sample)  # a prompt's samples are generations of their own
            if key not in seen:
                seen.add(key)
                generations.append(record)
    check_model_files(results)  # before any cell is computed from them
    check_plugins(results)
    jobs = _or_damaged(lambda: store.load_plan(tenant, sweep_id), "the plan (planned jobs, cell order)", damaged, None)
    planned = len(jobs) if jobs is not None else None
    order = list(dict.fromkeys(j["cell"] for j in jobs or []))
    kept = {"cell_order": order, "damaged": damaged, "loaded": with_generations}
    return SweepData(tenant, sweep_id, spec, results, generations, planned, **kept)


def _or_damaged(read: Callable[[], Any], what: str, damaged: list[str], default: Any) -> Any:
    """What `read` returns, or `default` where the record is damaged: named in one warning line and in `damaged`."""
    try:
        return read()
    except CorruptRecordError as err:
        structlog.get_logger("decodebench.report").warning(f"{err}; the report goes on without {what}")
        damaged.append(str(err))
        return default
