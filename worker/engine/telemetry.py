"""Memory and utilisation sampling while a job runs.

A thread samples the process RSS (psutil) and, on CUDA, the device's memory and
utilisation through NVML (nvidia-ml-py). NVML absent or failing: those fields are
None and the job still runs. NVML values are device-level (every process on the GPU).
"""

from __future__ import annotations

import threading
from typing import Any


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


def nvml_handle(device) -> Any:
    """The NVML handle of a torch CUDA device, matched by UUID (robust to CUDA_VISIBLE_DEVICES)."""
    nv = _nvml()
    if nv is None or device.type != "cuda":
        return None
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        if uuid is not None:
            return nv.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode())
        return nv.nvmlDeviceGetHandleByIndex(device.index or 0)
    except Exception:
        return None


class Sampler:
    """Context manager sampling RSS (and NVML) every `interval_s` seconds in a thread."""

    def __init__(self, device=None, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.handle = nvml_handle(device) if device is not None else None
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

    `read()` is None where there is no counter (CPU, no NVML, a GPU without the counter);
    the difference of two readings is the energy the whole device used meanwhile.
    """

    source = "nvml total energy counter (device-level)"

    def __init__(self, device) -> None:
        self.handle = nvml_handle(device) if device is not None else None

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
