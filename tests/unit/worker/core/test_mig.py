"""MIG on the CPU: NVML faked at its boundary (the `pynvml` module) as a MIG container sees it.

Inside a container given MIG slices, NVML lists the parent GPU (in MIG mode, its memory not
readable: NVMLError_NoPermission) and only the slices the container was given; CUDA reports a
slice's UUID without its `MIG-` prefix. What only a real MIG GPU can prove (that the driver
answers as faked here) is in scripts/device-checks.sh and docs/deploy.md.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pynvml
import pytest
import structlog.testing

from controller.ops.doctor import FAIL, PASS, check_nvml
from worker.core import nvml

pytestmark = pytest.mark.pure  # the engine's side (telemetry, torch) only where torch is installed

# UUIDs as published in the AKS MIG guide's example pods (an A100 40GB PCIe in 1g.5gb slices), and
# NVIDIA's "GPU Operator with MIG" (a whole A100-SXM4-40GB)
PARENT = "GPU-48aeb943-9458-4282-da24-e5f49e0db44b"
SLICES = {0: "MIG-fb42055e-9e53-5764-9278-438605a3014c", 3: "MIG-3d4db13e-c42d-5555-98f4-8b50389791bc"}
WHOLE = "GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f"
GiB = 2**30


def error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # the real subclass, e.g. NVMLError_NoPermission


class Dev(SimpleNamespace):
    pass


def devices(mig: bool) -> tuple[Dev, dict[int, Dev]]:
    """The GPU and the MIG slices (by MIG index) that NVML shows this container."""
    if not mig:
        return Dev(uuid=WHOLE, name="NVIDIA A100-SXM4-40GB", mig=None, total=40 * GiB), {}
    gpu = Dev(uuid=PARENT, name="NVIDIA A100 40GB PCIe", mig=None, total=40 * GiB)
    name = "NVIDIA A100 40GB PCIe MIG 1g.5gb"
    return gpu, {i: Dev(uuid=u, name=name, mig=gpu, total=5 * GiB) for i, u in SLICES.items()}


def fake_nvml(mig: bool) -> types.ModuleType:
    """A `pynvml` as NVML answers in a MIG container (mig=True) or on a whole GPU."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = pynvml.NVMLError
    nv.NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    gpu, slices = devices(mig)
    by_uuid = {d.uuid: d for d in [gpu, *slices.values()]}
    calls = {"util": 0, "energy": 0}

    def by_index(i):
        return gpu  # the one GPU (nvmlDeviceGetCount says 1)

    def handle_by_uuid(uuid: bytes):
        if uuid.decode() not in by_uuid:
            raise error(pynvml.NVML_ERROR_NOT_FOUND)
        return by_uuid[uuid.decode()]

    def memory(h):
        if mig and h is gpu:  # the parent of a MIG container's slices
            raise error(pynvml.NVML_ERROR_NO_PERMISSION)
        return SimpleNamespace(total=h.total, free=h.total - GiB, used=GiB)

    def utilisation(h):
        calls["util"] += 1
        if h.mig is not None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=42, memory=10)

    def energy(h):
        calls["energy"] += 1
        if h.mig is not None:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 1_000_000 + 5_000 * calls["energy"]

    def mig_handle(parent, i):
        if i not in slices:
            raise error(pynvml.NVML_ERROR_NOT_FOUND)
        return slices[i]

    nv.calls = calls
    vars(nv).update(
        nvmlInit=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=by_index,
        nvmlDeviceGetHandleByUUID=handle_by_uuid,
        nvmlDeviceGetName=lambda h: h.name,
        nvmlDeviceGetUUID=lambda h: h.uuid,
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetUtilizationRates=utilisation,
        nvmlDeviceGetTotalEnergyConsumption=energy,
        nvmlDeviceIsMigDeviceHandle=lambda h: h.mig is not None,
        nvmlDeviceGetMigMode=lambda h: (1, 1) if mig and h is gpu else (0, 0),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7 if mig and h is gpu else 0,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
    )
    return nv


@pytest.fixture
def telemetry():
    """The engine's telemetry (it imports torch: skipped where torch is not installed)."""
    return pytest.importorskip("worker.engine.telemetry", reason="the engine's telemetry needs torch")


@pytest.fixture
def on_cuda(monkeypatch):
    """Install a fake NVML and a CUDA device whose UUID is `uuid` (no prefix, as CUDA reports it)."""
    torch = pytest.importorskip("torch")

    def install(mig: bool, uuid: str, name: str = "NVIDIA A100 40GB PCIe MIG 1g.5gb"):
        nv = fake_nvml(mig)
        monkeypatch.setitem(sys.modules, "pynvml", nv)
        raw = uuid.split("-", 1)[1]
        props = SimpleNamespace(uuid=raw, name=name, total_memory=5 * GiB, major=8, minor=0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
        return nv, torch.device("cuda", 0)

    return install


def test_a_mig_slice_is_found_by_the_uuid_cuda_reports():
    nv = fake_nvml(mig=True)
    found = nvml.lookup(nv, SLICES[3].removeprefix("MIG-"))  # CUDA's UUID: no prefix
    assert (found.uuid, found.mig) == (SLICES[3], True)
    whole = nvml.lookup(fake_nvml(mig=False), WHOLE.removeprefix("GPU-"))
    assert (whole.uuid, whole.mig) == (WHOLE, False)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.lookup(nv, "00000000-0000-0000-0000-000000000000")


def test_on_a_mig_slice_memory_is_the_slices_and_utilisation_and_energy_are_not_attributed(on_cuda, telemetry):
    nv, device = on_cuda(mig=True, uuid=SLICES[0])
    with telemetry.Sampler(device, interval_s=0.01) as sampler:
        pass
    summary = sampler.summary()
    assert summary["nvml_peak_mb"] == 1024.0  # read from the MIG device handle, not the parent
    assert summary["gpu_util_mean"] is None and nv.calls["util"] == 0
    energy = telemetry.EnergyCounter(device)
    assert energy.read() is None and nv.calls["energy"] == 0  # the whole GPU's counter: never read for a slice
    scope = telemetry.telemetry_scope(device)
    assert scope["nvml_uuid"] == SLICES[0] and scope["mig"] is True and scope["memory"] == "MIG slice"
    assert scope["gpu_util"].startswith("not attributable") and "whole GPU" in scope["energy"]


def test_on_a_whole_gpu_everything_is_sampled(on_cuda, telemetry):
    nv, device = on_cuda(mig=False, uuid=WHOLE, name="NVIDIA A100-SXM4-40GB")
    with telemetry.Sampler(device, interval_s=0.01) as sampler:
        pass
    assert sampler.summary()["nvml_peak_mb"] == 1024.0 and sampler.summary()["gpu_util_mean"] == 42.0
    energy = telemetry.EnergyCounter(device)
    assert energy.joules(energy.read(), energy.read()) == 5.0
    assert telemetry.telemetry_scope(device) == {
        "nvml_uuid": WHOLE,
        "mig": False,
        "memory": "device",
        "gpu_util": "device",
        "energy": "device",
    }


def test_a_uuid_nvml_does_not_know_is_logged_not_silent(on_cuda, telemetry):
    nv, device = on_cuda(mig=True, uuid="GPU-00000000-0000-0000-0000-000000000000")
    with structlog.testing.capture_logs() as logs:
        assert telemetry.nvml_handle(device) is None
    (entry,) = logs
    assert entry["event"] == "nvml.device_not_found" and entry["log_level"] == "warning"
    assert entry["cuda_uuid"] == "00000000-0000-0000-0000-000000000000" and "NotFound" in entry["error"]
    assert telemetry.telemetry_scope(device)["nvml_uuid"] is None


def test_device_info_records_the_mig_uuid_and_the_telemetry_scope(on_cuda):
    from worker.engine.device import device_info

    _, device = on_cuda(mig=True, uuid=SLICES[3])
    info = device_info(device)
    assert info["uuid"] == SLICES[3] and info["telemetry"]["mig"] is True
    assert info["telemetry"]["energy"] == nvml.UNATTRIBUTABLE["energy"]


def test_without_nvml_the_prefix_follows_the_name_cuda_gives_a_mig_slice(on_cuda, monkeypatch):
    from worker.engine.device import device_info

    _, device = on_cuda(mig=True, uuid=SLICES[0])
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py missing
    info = device_info(device)
    assert info["uuid"] == SLICES[0] and info["telemetry"]["nvml_uuid"] is None


def test_doctor_in_a_mig_container_lists_its_slices_without_reading_the_parent(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(mig=True))
    rows = check_nvml(require_gpu=True)
    assert FAIL not in [level for level, _name, _detail in rows], rows
    by_name = {name: (level, detail) for level, name, detail in rows}
    assert "MIG mode, 2 MIG device(s) visible here" in by_name["gpu 0"][1]
    assert by_name["gpu 0 mig 0"] == (PASS, f"NVIDIA A100 40GB PCIe MIG 1g.5gb ({SLICES[0]}): 4.0 GiB free of 5.0 GiB")
    assert by_name["gpu 0 mig 1"][0] == PASS and SLICES[3] in by_name["gpu 0 mig 1"][1]


def test_doctor_finds_the_slices_when_the_parents_mig_mode_is_not_ours_to_ask(monkeypatch):
    nv = fake_nvml(mig=True)

    def refused(h):
        raise error(pynvml.NVML_ERROR_NO_PERMISSION)

    nv.nvmlDeviceGetMigMode = refused
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    rows = check_nvml(require_gpu=True)
    assert FAIL not in [level for level, _name, _detail in rows]
    assert [name for _level, name, _detail in rows] == ["nvml", "gpu 0", "gpu 0 mig 0", "gpu 0 mig 1"]


def test_doctor_on_a_whole_gpu_and_when_nothing_is_readable(monkeypatch):
    nv = fake_nvml(mig=False)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    rows = check_nvml(require_gpu=True)
    assert (PASS, "gpu 0", f"NVIDIA A100-SXM4-40GB ({WHOLE}): 39.0 GiB free of 40.0 GiB") in rows

    def refused(h):
        raise error(pynvml.NVML_ERROR_NO_PERMISSION)

    nv.nvmlDeviceGetName = refused
    rows = check_nvml(require_gpu=True)
    assert rows[-1] == (FAIL, "nvml", "no GPU or MIG device usable through NVML")
    assert "NVMLError_NoPermission" in rows[1][2]
    nv.nvmlDeviceGetName = lambda h: h.name
    nv.nvmlDeviceGetMemoryInfo = refused  # listed, but no memory to read: not usable
    assert check_nvml(require_gpu=True)[-1] == (FAIL, "nvml", "no GPU or MIG device usable through NVML")
