"""Local mode: plan a sweep and run its jobs in-process, no Redis.

The executor calls the same `worker.engine.job.run_job` as the RQ task. Jobs that already
have a complete result are skipped, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from controller.spec.load import load_spec
from controller.spec.models import SweepSpec
from controller.spec.plan import plan, summarize_plan
from worker.core import paths
from worker.core.contract import JobSpec
from worker.core.errors import DecodebenchError, UsageError
from worker.store import Store

log = structlog.get_logger("decodebench.local")


@dataclass
class RunOutcome:
    sweep_id: str
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def save_sweep(store: Store, spec: SweepSpec, jobs: list[JobSpec], tenant: str, mode: str) -> None:
    """spec.json (the validated spec) and plan.json (job ids per cell); written once per sweep."""
    sweep_id = jobs[0].sweep_id
    store.write_json(
        paths.spec_key(tenant, sweep_id),
        {
            "sweep_id": sweep_id,
            "tenant": tenant,
            "name": spec.name,
            "created_at": dt.datetime.now(dt.UTC).isoformat(),
            "mode": mode,
            "spec": spec.model_dump(mode="json"),
            "base_dir": str(spec.base_dir) if spec.base_dir else None,
        },
        create_only=True,
    )
    store.write_json(
        paths.plan_key(tenant, sweep_id),
        {
            "sweep_id": sweep_id,
            "jobs": [
                {"job_id": j.job_id, "cell": j.cell, "seed": j.seed, "shard": j.shard, "prompts": len(j.prompts)}
                for j in jobs
            ],
        },
        create_only=True,
    )


def run_sweep(
    spec: SweepSpec | str | Path, store: Store, tenant: str = "default", device: str = "cpu", progress: bool = True
) -> RunOutcome:
    """Run every job of the sweep that is not yet complete; return what happened."""
    from worker.engine.job import EngineSettings, Runtime, run_job  # the one place the controller hosts the engine

    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    runtime = Runtime(device, EngineSettings.from_environment())  # a device that does not exist fails first
    jobs = plan(spec, tenant)
    outcome = RunOutcome(jobs[0].sweep_id)
    save_sweep(store, spec, jobs, tenant, mode="local")
    complete = store.complete_job_ids(tenant, outcome.sweep_id)
    todo = [j for j in jobs if j.job_id not in complete]
    outcome.skipped = [j.job_id for j in jobs if j.job_id in complete]
    summary = summarize_plan(jobs)
    log.info("sweep.start", sweep_id=outcome.sweep_id, jobs=summary.jobs, todo=len(todo), cells=summary.cells)
    with _progress(progress, len(todo)) as advance:
        for job in todo:
            try:
                run_job(job, store=store, runtime=runtime)
                outcome.ran.append(job.job_id)
            except UsageError:
                raise
            except DecodebenchError as err:
                outcome.failed[job.job_id] = str(err)
            except Exception as err:  # a job's crash must not lose the other jobs
                outcome.failed[job.job_id] = f"{type(err).__name__}: {err}".splitlines()[0]
            advance(job.cell)
    return outcome


class _progress:
    """A rich progress bar (or nothing) with an `advance(label)` callback."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self):
        if not self.enabled:
            return lambda label: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        self.bar.start()
        task = self.bar.add_task("jobs", total=self.total)
        return lambda label: self.bar.update(task, advance=1, description=label[:48])

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.bar.stop()
