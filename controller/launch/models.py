"""Every model of a sweep resolved before any job runs, without loading weights (no torch).

`check_models(jobs)` asks `worker.core.hub.resolve` once per model (the generating models, the
scorer and the featurizer): a local directory needs its config.json, a hub id its config.json in
the local cache or from the hub. The hub's host is probed once, so an unreachable hub costs a
few seconds, not the hub client's retries for every model and job.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.core import hub
from worker.core.contract import JobSpec, ModelSpec
from worker.core.errors import ModelUnavailableError, short, shown
from worker.core.policy import job_models


@dataclass
class ModelCheck:
    model: ModelSpec
    found: str | None  # how it will be found ("a local directory", "in the local cache", "on the hub")
    reason: str | None  # why it cannot be (one line, with the fix); None when found

    @property
    def line(self) -> str:
        return f"model {short(self.model.label)} ({shown(self.model.path)}): {self.found or self.reason}"


def models_of(job: JobSpec) -> list[ModelSpec]:
    """The models a job loads: its own, the scorer, the featurizer and an assisted strategy's draft."""
    return [m for _, m in job_models(job)]


def check_models(jobs: list[JobSpec]) -> list[ModelCheck]:
    """One check per distinct model path and revision, in the order the jobs need them."""
    unique: dict[tuple[str, str | None], ModelSpec] = {}
    for job in jobs:
        for m in models_of(job):
            unique.setdefault((m.path, m.revision), m)
    remote = [m for m in unique.values() if not hub.is_local(m.path)]
    reachable = hub.hub_reachable() if remote and not hub.offline() else None
    checks = []
    for m in unique.values():
        try:
            checks.append(ModelCheck(m, hub.resolve(m.path, m.revision, reachable=reachable), None))
        except ModelUnavailableError as err:
            checks.append(ModelCheck(m, None, f"unavailable: {err}"))
    return checks
