"""`decodebench-worker`: an RQ worker pinned to one device.

    decodebench-worker --device cuda:0 --queues team-a --queues team-b   # tenants (all priorities)
    decodebench-worker --device cpu --queues '*' --burst                 # every tenant; exit when done
    decodebench-worker --device cuda:0 --engine vllm --queues team-a     # team-a's vLLM jobs only

Every option also reads its DECODEBENCH_* variable (`--help` lists them); see
`worker.core.settings`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

import click
import structlog

from worker.core import settings, usage
from worker.core.engines import ENGINE_NAMES, OWN_ENGINE, engine_unavailable
from worker.core.errors import DecodebenchError, UsageError
from worker.core.safetext import terminal

log = structlog.get_logger("decodebench.worker")


def prepare_cuda_env(env: MutableMapping[str, str]) -> list[str]:
    """Make CUDA's device numbering explicit before torch initialises CUDA; return notes.

    - CUDA_DEVICE_ORDER defaults to PCI_BUS_ID, so cuda:N, nvidia-smi and NVML agree.
    - CUDA_VISIBLE_DEVICES (indices or GPU-/MIG- UUIDs) is left to CUDA, which honours both.
    - NVIDIA_VISIBLE_DEVICES given as UUIDs (the Kubernetes device plugin's form) and no
      CUDA_VISIBLE_DEVICES: the UUIDs become CUDA_VISIBLE_DEVICES, which selects the same
      GPUs whether or not the container runtime already hid the others. Indices are left
      alone: inside a container the runtime renumbers the GPUs it exposes from 0.
    """
    notes = []
    if "CUDA_DEVICE_ORDER" not in env:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if "CUDA_VISIBLE_DEVICES" not in env and nvidia.lower() not in ("", "all", "none", "void"):
        parts = [p.strip() for p in nvidia.split(",") if p.strip()]
        if parts and all(p.startswith(("GPU-", "MIG-")) for p in parts):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(parts)
            notes.append(f"CUDA_VISIBLE_DEVICES set from NVIDIA_VISIBLE_DEVICES={nvidia}")
    return notes


def pin_device(device: str | None):
    """The worker's Runtime on `device` (required, must exist), CUDA numbering made explicit first."""
    from worker.engine.job import EngineSettings, Runtime

    if not device:
        raise UsageError("--device is required: cpu or cuda:N (or set DECODEBENCH_DEVICE)")
    settings.parse_device(device)
    for note in prepare_cuda_env(os.environ):
        log.info("worker.cuda_env", note=note)
    runtime = Runtime(device, EngineSettings.from_environment())  # refuses a device that does not exist
    info = runtime.device_info
    log.info(
        "worker.device",
        device=info.get("device"),
        name=info.get("name"),
        uuid=info.get("uuid"),
        driver=info.get("driver"),
        cuda=info.get("cuda"),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    return runtime


def check_start(device: str | None, engine: str) -> None:
    """A missing or malformed device, or an engine this environment cannot run (vLLM not importable):
    one line, exit 2, before the store, the device or Redis is touched."""
    if not device:
        raise UsageError("--device is required: cpu or cuda:N (or set DECODEBENCH_DEVICE)")
    settings.parse_device(device)
    if why := engine_unavailable(engine):
        raise UsageError(why)


def serve(
    *,
    device: str | None,
    queues: tuple[str, ...],
    engine: str = OWN_ENGINE,
    burst: bool,
    max_jobs: int | None,
    redis_url: str,
    store: str,
    name: str | None,
    stop_grace: float | None,
    heartbeat_ttl: float,
    reaper_interval: float,
    log_level: str,
) -> int:
    """Open the store, pin the device, connect to Redis and run the worker until it stops."""
    import redis

    from worker.core.errors import ServiceError
    from worker.core.redisconn import connect_patiently, redact_url
    from worker.rq.queues import bridge_rq_logging
    from worker.rq.reaper import Timing
    from worker.rq.worker import decodebench_worker
    from worker.store import open_store

    check_start(device, engine)
    opened = open_store(store)  # a bad store URL fails here, not in the first job
    runtime = pin_device(device)
    conn = connect_patiently(redis_url)
    try:
        conn.ping()
    except redis.RedisError as err:
        raise ServiceError(f"Redis at {redact_url(redis_url)} is not reachable: {err}") from None
    timing = Timing.from_settings(heartbeat_ttl=heartbeat_ttl, reaper_interval=reaper_interval)
    bridge_rq_logging(log_level)
    worker = _worker(decodebench_worker, list(queues), conn, opened, runtime, timing, stop_grace, name, engine)
    _log_start(worker, queues, opened.url, burst, timing)
    worker.work(burst=burst, max_jobs=max_jobs, logging_level=None)
    return 0


def _worker(cls, queues: list[str], conn, store, runtime, timing, stop_grace, name, engine: str):
    """The worker, given every setting it runs with from the settings table, here at the edge."""
    from worker.core.policy import Limits
    from worker.rq.sealed import signing_key

    return cls(
        queues,
        connection=conn,
        store=store,
        runtime=runtime,
        timing=timing,
        stop_grace=stop_grace,
        name=name,
        tenants_file=settings.get("tenants_file"),
        heartbeat_file=settings.get("heartbeat_file"),
        key=signing_key(),
        limits=Limits.from_settings(),
        max_job_bytes=int(settings.get("max_job_mb")) * 2**20,
        engine=engine,
    )


def _log_start(worker, queues: tuple[str, ...], store_url: str, burst: bool, timing) -> None:
    """The `worker.start` line, and one line per strategy plugin of this image that did not load
    (its jobs fail with that line)."""
    from worker.strategies import PROBLEMS

    log.info(
        "worker.start",
        name=worker.name,
        engine=worker.logic.engine,
        queues=worker.queue_names() or list(queues),
        store=store_url,
        burst=burst,
        heartbeat_ttl_s=timing.heartbeat_ttl,
        reaper_interval_s=timing.reaper_interval,
        lost_job_requeued_within_s=timing.detection_bound,
    )
    for problem in PROBLEMS:
        log.warning("worker.strategy_plugin_not_loaded", problem=problem.line)


@click.command(cls=usage.Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("more_queues", nargs=-1, metavar="[QUEUE]...")
@settings.option("device", help="Device: cpu or cuda:N; required, never falls back.")
@settings.option(
    "queues",
    multiple=True,
    help="Tenants, queue names decodebench.<tenant>.<priority>[.<engine>], or '*' for every tenant; repeatable "
    "or comma-separated. Only the queues of --engine.",
)
@settings.option("engine", type=click.Choice(ENGINE_NAMES))
@click.option("--burst", is_flag=True, help="Exit once no job of the queues is queued, running or waiting to retry.")
@click.option("--max-jobs", type=click.IntRange(min=1), default=None, help="Exit after this many jobs.")
@settings.option("redis_url")
@settings.option("store")
@click.option("--name", default=None, help="Worker name in RQ (default decodebench-<host>-<pid>-<device>-<random>).")
@settings.option("stop_grace")
@settings.option("heartbeat_ttl")
@settings.option("reaper_interval")
@settings.option("log_format", type=click.Choice(["console", "json"]))
@settings.option("log_level")
@click.version_option(package_name="decodebench")
def main(log_format: str, log_level: str, more_queues: tuple[str, ...], **options) -> None:
    """Run decodebench jobs from Redis (RQ) on one device.

    QUEUE arguments add to --queues, so `--queues team-a team-b` serves both tenants.
    """
    from worker.core.logs import configure

    configure(log_format, log_level)
    queues = options.pop("queues")
    queues = ((queues,) if isinstance(queues, str) else tuple(queues)) + more_queues
    try:
        code = serve(queues=queues or ("*",), log_level=log_level, **options)
    except DecodebenchError as err:
        click.echo(f"error: {terminal(err)}", err=True)
        code = err.exit_code
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
