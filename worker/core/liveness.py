"""A worker process's liveness file: touched on every heartbeat, busy or idle; the pod's startup,
readiness and liveness probes read it (charts/decodebench/files/probe-heartbeats.sh). Shared by
`decodebench-worker` (worker.rq) and `decodebench report-worker` (controller.report.distribute.mapworker)."""

from __future__ import annotations

import os

import structlog

log = structlog.get_logger("decodebench.worker")


def touch(path: str | None) -> None:
    """Mark this process alive for the pod's probes (no file configured: nothing to do). The folder
    is made if missing: the pod's /tmp starts empty."""
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a"):
            pass
        os.utime(path)
    except OSError as err:
        log.warning("worker.heartbeat_file_error", path=path, error=str(err))
