"""A cell's statistics as a report task (controller.report.compute.tasks): its digest, payload and checks.

The payload a report worker gets is the cell's digest, its jobs with their generations' SHA-256,
its row so far, the prompt order, its batch units and the settings. The worker reads the cell's
results and records from its OWN store under the payload's tenant, checks each result's hash
against the payload (`checked_units`), and computes the cell as local mode does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from controller.metrics import METRICS, Metric
from controller.metrics.extract import task_section
from controller.report.compute.cache import ReportCache
from controller.report.compute.cells import (
    CellOutput,
    CellTask,
    Settings,
    digest,
    from_json,
    run_cell,
    spill,
    to_json,
)
from controller.report.compute.runner import Runner
from controller.report.compute.tasks import DIGEST, Uncacheable, bounded
from controller.report.load.jobs import job_reader, read_each
from controller.report.stats.speed import job_units, join_units
from worker.core import paths
from worker.core.errors import CorruptRecordError, PermanentJobError


@dataclass
class CellJob:
    """One cell to compute: its task, the settings, and its metrics where they are not the global registry's."""

    kind: ClassVar[str] = "cell"
    prefix: ClassVar[str] = ""
    digest_field: ClassVar[str] = "digest"
    signer_call: ClassVar[str] = "report_cells"

    task: CellTask
    settings: Settings
    metrics: tuple[tuple[str, Metric], ...] | None = None  # None: the global registry's, by name
    digest: str | None = None  # its content digest (`cells.digest`), where its cache is at hand

    @property
    def name(self) -> str | None:
        return self.digest

    @property
    def label(self) -> str:
        return self.task.cell

    @property
    def portable(self) -> bool:
        return self.metrics is None

    def run(self) -> CellOutput:
        selected = self.metrics or [(n, METRICS.get(n)) for n in self.settings.names]
        return run_cell(self.task, selected, self.settings)

    def entry(self, output: CellOutput) -> dict[str, Any]:
        if output.damaged:
            raise Uncacheable(output.damaged[0])
        return to_json(output)

    def output(self, entry: dict[str, Any]) -> CellOutput:
        return from_json(entry)

    def payload(self) -> dict[str, Any]:
        """What a report job carries: enough to rebuild the cell's task from the store, no records."""
        _, tenant, sweep_id = self.task.where  # type: ignore[misc]
        return {
            "tenant": tenant,
            "sweep_id": sweep_id,
            "cell": self.task.cell,
            "digest": self.digest,
            "jobs": sorted([job_id, sha] for job_id, sha in self.task.jobs),
            "row": {k: v.item() if hasattr(v, "item") else v for k, v in self.task.row.items()},
            "prompt_rank": self.task.prompt_rank,
            "units": self.task.units,
            "settings": dataclasses.asdict(self.settings),
        }

    def request(self) -> tuple[str, dict[str, Any]] | None:
        s = self.settings
        return self.task.where[2], {"n_boot": s.n_boot, "n_boot_corpus": s.n_boot_corpus, "seed": s.seed}  # type: ignore[index]

    @classmethod
    def answered(cls, reply: dict[str, Any]) -> set[str]:
        return set(reply.get("digests") or [])

    @classmethod
    def refusal(cls, doc: dict[str, Any], tenant: str) -> str | None:
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

    @classmethod
    def from_payload(cls, doc: dict[str, Any], store) -> CellJob:
        """The cell's task rebuilt in a report worker from its own store, each job checked against the payload."""
        tenant, sweep_id = doc["tenant"], doc["sweep_id"]
        settings = settings_of(doc["settings"])
        jobs = [(paths.check_id("job", job_id), sha) for job_id, sha in doc["jobs"]]
        units = checked_units(store, tenant, sweep_id, doc["cell"], jobs)
        if units != doc["units"]:  # what the digest was computed over
            raise PermanentJobError("a job's timings changed since the report was asked for; report again")
        where = (store.url, tenant, sweep_id)
        task = CellTask(doc["cell"], doc["row"], jobs, doc["prompt_rank"], None, where, units)
        return cls(task, settings, digest=doc["digest"])


def cell_job(task: CellTask, settings: Settings, metrics, cached: bool) -> CellJob:
    """A cell's job, with its digest where its outputs are `cached` (the store at hand, the task's `where` set)."""
    return CellJob(task, settings, metrics, digest(task, settings) if cached and task.where is not None else None)


def cell_outputs(jobs: list[CellJob], cache: ReportCache | None, runner: Runner) -> list[CellOutput]:
    """Every cell's output, in order, each `spill`ed as it comes (from the cache, the workers or computed):
    the outputs held grow by a row per cell, not by a cell's per-prompt statistics."""
    outputs: list[CellOutput | None] = [None] * len(jobs)
    for i, out in runner.run(jobs, cache, "cells"):
        outputs[i] = spill(out, jobs[i].name)
    return outputs  # type: ignore[return-value]


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
    if why := bounded(s.__dict__, ("n_boot", "n_boot_corpus", "seed"), "report job"):
        raise PermanentJobError(why)
    return s


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
