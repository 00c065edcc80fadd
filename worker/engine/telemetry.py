"""Memory and utilisation sampling while a job runs.

A thread samples the process RSS (psutil) and, on CUDA, the device's memory and
utilisation through NVML (nvidia-ml-py). NVML absent or failing: those fields are
None and the job still runs. NVML values are device-level (every process on the GPU).
The device is found by the UUID CUDA reports, a MIG slice included (worker.core.nvml): a slice's
memory is its own; its utilisation and energy are not sampled (NVML has none per slice; the energy
counter is the whole GPU's), and `telemetry_scope` says so in every result's provenance.
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

from worker.core import nvml

log = structlog.get_logger("decodebench.telemetry")


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # library missing, no driver: NVML fields stay empty
        return None


def nvml_driver_version() -> str | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        v = nv.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:
        return None


def nvml_device(device) -> nvml.NvmlDevice | None:
    """The NVML device of a torch CUDA device, matched by the UUID CUDA reports (GPU- or MIG-).

    None without NVML, on the CPU, or when NVML does not know the UUID (logged: the memory,
    utilisation and energy fields of the job's results then stay empty).
    """
    nv = _nvml()
    if nv is None or device.type != "cuda":
        return None
    uuid = None
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        if uuid is not None:
            return nvml.lookup(nv, str(uuid))
        handle = nv.nvmlDeviceGetHandleByIndex(device.index or 0)  # a torch without UUIDs
        return nvml.NvmlDevice(handle, nvml.text(nv.nvmlDeviceGetUUID(handle)), nvml.is_mig(nv, handle))
    except Exception as err:
        log.warning(
            "nvml.device_not_found", device=str(device), cuda_uuid=str(uuid), error=f"{type(err).__name__}: {err}"
        )
        return None


def nvml_handle(device) -> Any:
    """The NVML handle of a torch CUDA device (a MIG device handle on a MIG slice), or None."""
    found = nvml_device(device)
    return found.handle if found is not None else None


def telemetry_scope(device) -> dict[str, Any] | None:
    """What the NVML fields of a result measure on this device, or why they are empty (provenance)."""
    if device.type != "cuda":
        return None
    found = nvml_device(device)
    if found is None:
        return {"nvml_uuid": None, "memory": "unavailable: NVML missing or the device not found by its UUID"}
    return found.scope()


class Sampler:
    """Context manager sampling RSS (and NVML) every `interval_s` seconds in a thread."""

    def __init__(self, device=None, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        found = nvml_device(device) if device is not None else None
        self.handle = found.handle if found is not None else None
        self.mig = found is not None and found.mig  # a MIG slice: memory only (worker.core.nvml)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="decodebench-telemetry", daemon=True)
        self.rss: list[float] = []
        self.gpu_mem: list[float] = []
        self.gpu_util: list[float] = []

    def _sample(self) -> None:
        import psutil

        self.rss.append(psutil.Process().memory_info().rss / 2**20)
        if self.handle is not None:
            try:
                import pynvml

                self.gpu_mem.append(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20)
                if not self.mig:
                    self.gpu_util.append(float(pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            except Exception:
                self.handle = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def summary(self) -> dict[str, float | None]:
        def mean(xs):
            return round(sum(xs) / len(xs), 2) if xs else None

        return {
            "rss_peak_mb": round(max(self.rss), 2) if self.rss else None,
            "nvml_peak_mb": round(max(self.gpu_mem), 2) if self.gpu_mem else None,
            "nvml_mean_mb": mean(self.gpu_mem),
            "gpu_util_mean": mean(self.gpu_util),
        }


class EnergyCounter:
    """The device's NVML total-energy counter (millijoules since the driver loaded), read around a batch.

    `read()` is None where there is no counter (CPU, no NVML, a GPU without the counter) or where
    it is not the device's own (a MIG slice);
    the difference of two readings is the energy the whole device used meanwhile.
    """

    source = "nvml total energy counter (device-level)"

    def __init__(self, device) -> None:
        found = nvml_device(device) if device is not None else None
        # a MIG slice: the counter is the whole GPU's, never attributed to the slice (nvml.UNATTRIBUTABLE)
        self.handle = found.handle if found is not None and not found.mig else None

    def read(self) -> float | None:
        if self.handle is None:
            return None
        try:
            import pynvml

            return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:  # not supported on this GPU: stop asking
            self.handle = None
            return None

    @staticmethod
    def joules(before: float | None, after: float | None) -> float | None:
        if before is None or after is None or after < before:
            return None
        return round((after - before) / 1000.0, 4)
