"""Explicit device selection: `cpu` or `cuda:N`, never a silent fallback."""

from __future__ import annotations

import os
from typing import Any

from worker.core.errors import UsageError
from worker.core.settings import parse_device


def resolve_device(name: str):
    """The torch.device for `name`, or a UsageError if it does not exist here."""
    import torch

    name = parse_device(name)
    if name == "cpu":
        return torch.device("cpu")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    if not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine{where}; use --device cpu explicitly")
    index = int(name.split(":")[1])
    count = torch.cuda.device_count()
    if index >= count:
        raise UsageError(f"--device {name}: only {count} CUDA device(s) visible{where}")
    torch.cuda.set_device(index)
    return torch.device(name)


def device_info(device) -> dict[str, Any]:
    """Name, UUID, driver and CUDA version of the device (for every result's provenance)."""
    import torch

    info: dict[str, Any] = {"device": str(device), "type": device.type}
    if device.type == "cuda":
        from worker.engine.telemetry import nvml_driver_version, telemetry_scope

        props = torch.cuda.get_device_properties(device)
        scope = telemetry_scope(device)  # what NVML measures here: the GPU, or a MIG slice (its memory only)
        info.update(
            name=props.name,
            uuid=(scope or {}).get("nvml_uuid") or _prefixed_uuid(props),
            total_memory_mb=round(props.total_memory / 2**20),
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            telemetry=scope,
        )
        info["driver"] = nvml_driver_version()
    else:
        import platform

        info.update(name=platform.processor() or platform.machine(), uuid=None, cuda=None, driver=None)
        info["threads"] = torch.get_num_threads()
    return info


def _prefixed_uuid(props) -> str | None:
    """The UUID as nvidia-smi writes it, without NVML: CUDA names a MIG slice "<GPU> MIG <profile>"."""
    uuid = getattr(props, "uuid", None)
    if not uuid:
        return None
    return f"{'MIG' if ' MIG ' in f' {props.name} ' else 'GPU'}-{uuid}"
