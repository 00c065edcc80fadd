"""`decodebench doctor`'s checks: torch/CUDA, NVML and the GPUs, Redis, the store.

Each check returns (level, name, detail) rows; a missing torch or NVML is a note on a
controller-only install, a failure with `--require-gpu`.
"""

from __future__ import annotations

import os

from worker.store import open_store

PASS, FAIL, NOTE = "PASS", "FAIL", "NOTE"


def check_torch(require_gpu: bool) -> list[tuple[str, str, str]]:
    """torch and CUDA: a missing torch is a note (controller-only install), not a failure."""
    try:
        import torch
    except ImportError:
        return [
            (NOTE, "torch", "not installed (a controller-only install); workers need `pip install decodebench[worker]`")
        ]
    out = [(PASS, "torch", f"torch {torch.__version__}")]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    if not torch.cuda.is_available():
        out.append(
            (FAIL if require_gpu else NOTE, "cuda", f"CUDA not available{where}: workers run with --device cpu only")
        )
        return out
    count = torch.cuda.device_count()
    out.append((PASS, "cuda", f"CUDA {torch.version.cuda}, {count} device(s){where}"))
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        mig = " MIG " in f" {props.name} "  # CUDA names a MIG slice "<GPU> MIG <profile>"
        uuid = f"{'MIG' if mig else 'GPU'}-{props.uuid}" if getattr(props, "uuid", None) else "?"
        try:
            free, total = torch.cuda.mem_get_info(i)
            mem = f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB"
        except Exception as err:  # a busy or broken device
            mem = f"free memory unknown ({type(err).__name__})"
        out.append((PASS, f"cuda:{i}", f"{props.name} ({uuid}): {mem}"))
    return out


def check_nvml(require_gpu: bool) -> list[tuple[str, str, str]]:
    """NVML (nvidia-ml-py): GPU telemetry. Missing is a note unless --require-gpu.

    Inside a MIG container NVML shows the parent GPU, whose memory the container may not read:
    the parent is listed without it and each visible MIG slice with its own (worker.core.nvml).
    """
    from worker.core import nvml

    level = FAIL if require_gpu else NOTE
    try:
        import pynvml
    except ImportError:
        return [(level, "nvml", "nvidia-ml-py not installed: no GPU memory/utilisation telemetry")]
    try:
        pynvml.nvmlInit()
        driver, count = nvml.text(pynvml.nvmlSystemGetDriverVersion()), pynvml.nvmlDeviceGetCount()
    except Exception as err:
        return [(level, "nvml", f"NVML unavailable ({type(err).__name__}: {err}): no GPU telemetry")]
    rows = nvml.inventory(pynvml)
    out = [(PASS, "nvml", f"driver {driver}, {count} GPU(s)")]
    out += [(PASS if usable else NOTE, name, detail) for name, detail, usable in rows]
    if require_gpu and not any(usable for _name, _detail, usable in rows):
        out.append((FAIL, "nvml", "no GPU or MIG device usable through NVML"))
    return out


def check_redis(url: str, tenant: str) -> tuple[str, str, str]:
    import redis

    from worker.core import keys
    from worker.core.errors import DecodebenchError
    from worker.core.redisconn import connect, redact_url

    try:
        conn = connect(url)
        key = keys.doctor(tenant)
        conn.set(key, "ok", ex=60)
        if conn.get(key) != b"ok":
            return FAIL, "redis", f"{redact_url(url)}: read back differs from what was written"
        conn.delete(key)
        try:
            version = conn.info("server").get("redis_version", "?")
        except redis.ResponseError:  # a tenant's ACL user may not run INFO
            version = "? (INFO not permitted to this user)"
    except DecodebenchError as err:
        return FAIL, "redis", str(err)
    except Exception as err:
        return FAIL, "redis", f"{redact_url(url)}: {type(err).__name__}: {err}".splitlines()[0]
    return PASS, "redis", f"{redact_url(url)} reachable and writable (Redis {version})"


def check_store(url: str) -> tuple[str, str, str]:
    try:
        store = open_store(url)
        store.check()
    except Exception as err:
        return FAIL, "store", f"{url}: {type(err).__name__}: {err}".splitlines()[0]
    return PASS, "store", f"{store.url} reachable and writable"
