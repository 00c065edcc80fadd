"""NVML devices by the UUID CUDA reports, whole GPUs and MIG slices alike.

CUDA reports a device's UUID without NVML's prefix: a whole GPU is `GPU-<uuid>` to NVML, a MIG
slice (a compute instance) `MIG-<uuid>`. Inside a MIG container NVML also lists the parent GPU,
whose memory and counters the container may not read (NVMLError_NoPermission) and whose
utilisation and energy belong to every slice on it. So:

- a device is looked up by both prefixes and NVML says which it found (`nvmlDeviceIsMigDeviceHandle`);
- a slice's memory is read from its own MIG device handle;
- utilisation (NVML has none per slice: "On MIG-enabled GPUs, querying device utilization rates is
  not currently supported", nvmlDeviceGetUtilizationRates) and energy (the whole GPU's counter) are
  not attributed to a slice: `UNATTRIBUTABLE` says why, and results record it instead of a number.

Every function takes the `pynvml` module (nvidia-ml-py) as `nv`, so the tests can stand a fake in
at exactly this boundary. No torch here: the controller's `doctor` uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNATTRIBUTABLE = {
    "gpu_util": "not attributable on a MIG slice: NVML reports no utilisation per MIG device",
    "energy": "not attributable on a MIG slice: NVML's energy counter is the whole GPU's, shared by all its slices",
}


@dataclass(frozen=True)
class NvmlDevice:
    """An NVML handle with the UUID it was found by and whether it is a MIG slice."""

    handle: Any
    uuid: str
    mig: bool

    def scope(self) -> dict[str, Any]:
        """What NVML telemetry means for this device (recorded in every result's provenance)."""
        if not self.mig:
            return {"nvml_uuid": self.uuid, "mig": False, "memory": "device", "gpu_util": "device", "energy": "device"}
        return {"nvml_uuid": self.uuid, "mig": True, "memory": "MIG slice", **UNATTRIBUTABLE}


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def lookup(nv, cuda_uuid: str) -> NvmlDevice:
    """The NVML device of a UUID as CUDA reports it (no prefix; a prefixed one is taken as is).

    Raises the last NVMLError when neither `GPU-` nor `MIG-` finds it.
    """
    raw = cuda_uuid.strip()
    candidates = [raw] if raw.startswith(("GPU-", "MIG-")) else [f"GPU-{raw}", f"MIG-{raw}"]
    error: Exception | None = None
    for uuid in candidates:
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid.encode())
        except nv.NVMLError as err:
            error = err
            continue
        return NvmlDevice(handle, uuid, is_mig(nv, handle) or uuid.startswith("MIG-"))
    assert error is not None
    raise error


def is_mig(nv, handle) -> bool:
    try:
        return bool(nv.nvmlDeviceIsMigDeviceHandle(handle))
    except nv.NVMLError:  # a driver without MIG support: a whole GPU
        return False


def memory_line(nv, handle) -> tuple[str, bool]:
    """Free of total memory, and whether NVML let this process read it."""
    try:
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
    except nv.NVMLError as err:
        return f"memory not readable here ({type(err).__name__})", False
    return f"{mem.free / 2**30:.1f} GiB free of {mem.total / 2**30:.1f} GiB", True


def mig_enabled(nv, handle) -> bool:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
    except nv.NVMLError:  # not MIG-capable, or not ours to ask
        return False
    return current == nv.NVML_DEVICE_MIG_ENABLE


def mig_devices(nv, parent) -> list[Any]:
    """The MIG devices of a GPU that this process can see (a container sees only its own)."""
    try:
        most = nv.nvmlDeviceGetMaxMigDeviceCount(parent)
    except nv.NVMLError:
        return []
    found = []
    for i in range(most):
        try:
            found.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, i))
        except nv.NVMLError:  # no slice at this index, or one of another container
            continue
    return found


def inventory(nv) -> list[tuple[str, str, bool]]:
    """(name, detail, usable) per GPU and per MIG slice NVML shows, for `decodebench doctor`.

    A GPU in MIG mode is listed without reading its memory (a MIG container may not) and its slices
    after it, each with its own memory; a whole GPU with its memory. Never raises an NVMLError.
    """
    rows: list[tuple[str, str, bool]] = []
    for i in range(nv.nvmlDeviceGetCount()):
        try:
            gpu = nv.nvmlDeviceGetHandleByIndex(i)
            name, uuid = text(nv.nvmlDeviceGetName(gpu)), text(nv.nvmlDeviceGetUUID(gpu))
        except nv.NVMLError as err:
            rows.append((f"gpu {i}", f"not readable ({type(err).__name__}: {err})", False))
            continue
        slices = mig_devices(nv, gpu)  # also where a MIG container may not ask the parent's MIG mode
        if not slices and not mig_enabled(nv, gpu):
            memory, readable = memory_line(nv, gpu)
            rows.append((f"gpu {i}", f"{name} ({uuid}): {memory}", readable))
            continue
        rows.append((f"gpu {i}", f"{name} ({uuid}): MIG mode, {len(slices)} MIG device(s) visible here", False))
        for j, mig in enumerate(slices):
            try:
                mig_name, mig_uuid = text(nv.nvmlDeviceGetName(mig)), text(nv.nvmlDeviceGetUUID(mig))
            except nv.NVMLError as err:
                rows.append((f"gpu {i} mig {j}", f"not readable ({type(err).__name__})", False))
                continue
            memory, readable = memory_line(nv, mig)
            rows.append((f"gpu {i} mig {j}", f"{mig_name} ({mig_uuid}): {memory}", readable))
    return rows
