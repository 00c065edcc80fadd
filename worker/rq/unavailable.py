"""A model that cannot load fails once in a distributed sweep (issue 28 item 1, as local mode does).

Before a job runs, `before_job` asks the sweep (`worker.sweepstate.unavailable`) about the job's
models: a model a worker already failed to load fails the job at once with that reason, for good,
without a load attempt; the first job of a model in the sweep loads it under the sweep's probe
while the other workers wait for the outcome, so a model that cannot load is tried once, not once
per worker. `after_failure` marks a model whose load failed (`ModelUnavailableError`, with the cause
and fix that `worker.core.hub` names) and returns the error to record: the reason that stands.
"""

from __future__ import annotations

import os
import socket
import time

import structlog

from worker import sweepstate
from worker.core.contract import JobSpec
from worker.core.errors import ModelUnavailableError, PermanentJobError
from worker.core.policy import job_models

log = structlog.get_logger("decodebench.task")
WAIT_S = 0.25  # between two looks at another worker's first load
WORKER = f"{socket.gethostname()}:{os.getpid()}"


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else ""


def _died_here(worker: str) -> bool:
    """Whether `worker` ("host:pid") ran on this host and its process is gone (another host's prober frees
    its probe when the probe's deadline passes, `sweepstate.unavailable.PROBE_S`)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # killed but not yet reaped by its parent: a zombie
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def before_job(conn, spec: JobSpec, runtime) -> None:
    """Fail the job (PermanentJobError) if a model it needs is marked unavailable in its sweep; else load its
    model first where the sweep has not loaded it yet (the probe), waiting while another worker does."""
    t, s = spec.tenant, spec.sweep_id
    paths = [m.path for _, m in job_models(spec)]
    dead = ""
    while True:
        verdict, path, reason = sweepstate.gate_models(conn, t, s, paths, WORKER, dead)
        if verdict == "fail":
            log.warning("job.model_unavailable", job_id=spec.job_id, model=path, reason=reason)
            raise PermanentJobError(reason or f"model {path} is unavailable")
        if verdict != "wait":
            break
        dead = reason if reason and _died_here(reason) else ""  # a prober of this host that died: take over
        if not dead:
            time.sleep(WAIT_S)
    if verdict == "run":
        return
    cache = getattr(runtime, "cache", None)  # a runtime without a model cache has nothing to load first
    try:
        if cache is not None and (spec.engine is None or spec.engine.name != "vllm"):  # vLLM loads its own
            log.info("model.first_load", job_id=spec.job_id, model=spec.model.path)
            cache.get(spec.model, runtime.device)
    except ModelUnavailableError:
        raise  # after_failure marks it
    except BaseException:
        sweepstate.loaded_model(conn, t, s, spec.model.path)  # not the model's fault: the others try it
        raise
    sweepstate.loaded_model(conn, t, s, spec.model.path)


def after_failure(conn, spec: JobSpec, err: BaseException) -> BaseException:
    """The error to record for a failed job: for a model that cannot load, marked once in the sweep, the reason
    that stands there (the first worker's)."""
    if not isinstance(err, ModelUnavailableError):
        return err
    path = err.model or spec.model.path
    reason = _first_line(str(err)) or type(err).__name__
    standing = sweepstate.mark_unavailable(conn, spec.tenant, spec.sweep_id, path, reason)
    log.warning("model.unavailable", job_id=spec.job_id, model=path, reason=standing)
    return err if standing == reason else PermanentJobError(standing)
