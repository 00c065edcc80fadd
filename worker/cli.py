"""`decodebench-worker`: an RQ worker pinned to one device.

    decodebench-worker --device cuda:0 --queues team-a team-b     # tenants (all priorities)
    decodebench-worker --device cpu --queues '*' --burst          # every tenant; exit when done

Settings: flags, then DECODEBENCH_* variables (DECODEBENCH_REDIS_URL, DECODEBENCH_STORE,
DECODEBENCH_DEVICE, DECODEBENCH_QUEUES, DECODEBENCH_STOP_GRACE, DECODEBENCH_HEARTBEAT_TTL,
DECODEBENCH_REAPER_INTERVAL, DECODEBENCH_LOG_FORMAT), then defaults.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import MutableMapping

import structlog

from worker.errors import DecodebenchError, ServiceError, UsageError

log = structlog.get_logger("decodebench.worker")
from worker.keys import DEFAULT_REDIS_URL


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


def _float_env(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="decodebench-worker", description="Run decodebench jobs from Redis (RQ) on one device.")
    p.add_argument("--device", default=os.environ.get("DECODEBENCH_DEVICE"),
                   help="cpu or cuda:N (env DECODEBENCH_DEVICE); required, never falls back")
    p.add_argument("--queues", nargs="+", default=None, metavar="Q",
                   help="tenants, queue names decodebench.<tenant>.<priority>, or '*' for every tenant "
                        "(env DECODEBENCH_QUEUES, comma-separated; default '*')")
    p.add_argument("--burst", action="store_true", help="exit once no job of the queues is queued, running or waiting to retry")
    p.add_argument("--max-jobs", type=int, default=None, help="exit after this many jobs")
    p.add_argument("--redis-url", default=None, help=f"env DECODEBENCH_REDIS_URL; default {DEFAULT_REDIS_URL}")
    p.add_argument("--store", default=None, help="file path or s3://bucket/prefix (env DECODEBENCH_STORE; default ./runs)")
    p.add_argument("--name", default=None, help="worker name in RQ (default decodebench-<host>-<pid>-<device>-<random>)")
    p.add_argument("--stop-grace", type=float, default=_float_env("DECODEBENCH_STOP_GRACE"),
                   help="on SIGTERM, seconds to let the current job finish before requeueing it (default: its timeout)")
    p.add_argument("--heartbeat-ttl", type=float, default=None,
                   help="seconds without a heartbeat after which a running job counts as lost (env DECODEBENCH_HEARTBEAT_TTL; default 60)")
    p.add_argument("--reaper-interval", type=float, default=None,
                   help="seconds between searches for lost jobs (env DECODEBENCH_REAPER_INTERVAL; default 15)")
    p.add_argument("--log-format", choices=["console", "json"], default=None, help="env DECODEBENCH_LOG_FORMAT; default console")
    p.add_argument("--log-level", default=None, help="env DECODEBENCH_LOG_LEVEL; default info")
    return p


def run(args: argparse.Namespace) -> int:
    import redis

    from worker.device import parse_device
    from worker.job import Runtime, set_runtime
    from worker.queueing import Timing
    from worker.rqworker import DecodebenchWorker, bridge_rq_logging
    from worker.store import open_store

    if not args.device:
        raise UsageError("--device is required: cpu or cuda:N (or set DECODEBENCH_DEVICE)")
    device = parse_device(args.device)
    if args.store:
        os.environ["DECODEBENCH_STORE"] = args.store
    store = open_store()  # a bad store URL fails here, not in the first job
    for note in prepare_cuda_env(os.environ):
        log.info("worker.cuda_env", note=note)
    runtime = Runtime(device)  # refuses a device that does not exist
    set_runtime(runtime)
    info = runtime.device_info
    log.info("worker.device", device=info.get("device"), name=info.get("name"), uuid=info.get("uuid"),
             driver=info.get("driver"), cuda=info.get("cuda"),
             cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    url = args.redis_url or os.environ.get("DECODEBENCH_REDIS_URL") or DEFAULT_REDIS_URL
    conn = connect_patiently(url)
    try:
        conn.ping()
    except redis.RedisError as err:
        raise ServiceError(f"Redis at {_safe_url(url)} is not reachable: {err}") from None
    timing = Timing.from_env(heartbeat_ttl=args.heartbeat_ttl, reaper_interval=args.reaper_interval)
    selectors = args.queues or [os.environ.get("DECODEBENCH_QUEUES") or "*"]
    bridge_rq_logging(args.log_level or os.environ.get("DECODEBENCH_LOG_LEVEL", "info"))
    worker = DecodebenchWorker(selectors, connection=conn, timing=timing, stop_grace=args.stop_grace,
                               device=device, name=args.name)
    log.info("worker.start", name=worker.name, queues=worker.queue_names() or selectors, store=store.url,
             burst=args.burst, heartbeat_ttl_s=timing.heartbeat_ttl, reaper_interval_s=timing.reaper_interval,
             lost_job_requeued_within_s=timing.detection_bound)
    worker.work(burst=args.burst, max_jobs=args.max_jobs, logging_level=None)
    return 0


def connect_patiently(url: str):
    """A Redis client that rides out a Redis restart: connection errors are retried with
    jittered exponential backoff (0.5 s doubling, capped at 10 s, 12 times: about a minute)."""
    import redis
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(url, health_check_interval=30,
                                retry=Retry(ExponentialWithJitterBackoff(cap=10, base=0.5), 12))


def _safe_url(url: str) -> str:
    """The Redis URL without its password (never log a secret)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from worker.logs import configure

    configure(args.log_format, args.log_level)
    try:
        code = run(args)
    except DecodebenchError as err:
        print(f"error: {err}", file=sys.stderr)
        code = err.exit_code
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
