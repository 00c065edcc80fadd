"""The worker pod's launcher and probes, run from the rendered chart with a fake
`decodebench-worker` and a fake `nvidia-smi`: one process per GPU or MIG slice pinned by UUID, a
crashed process restarted with backoff while the others keep taking jobs, a real exit status,
and probes that read each process's heartbeat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.support.chart import VALUES_BY_NAME, render, workers
from worker.rq.worker import touch

FAKE_WORKER = r"""#!/bin/bash
echo "start $$ ${CUDA_VISIBLE_DEVICES:-none} $*" >> "$LOG"
echo "port ${CUDA_VISIBLE_DEVICES:-cpu} ${DECODEBENCH_METRICS_PORT:-unset}" >> "$LOG"
trap 'echo "term $$" >> "$LOG"; sleep 0.3; echo "done $$" >> "$LOG"; exit "${TERM_STATUS:-0}"' TERM
dev="${CUDA_VISIBLE_DEVICES:-cpu}"
if [[ "$dev" == "${CRASH_DEVICE:-none}" ]]; then sleep 0.3; exit 3; fi
while :; do
  touch "$DECODEBENCH_HEARTBEAT_FILE"
  echo job >> "$JOBS/$dev"   # one "job" taken every tick
  sleep 0.05
done
"""

FAKE_NVIDIA_SMI = r"""#!/bin/bash
[[ "$1" == -L ]] || exit 2
printf '%b' "$FAKE_GPUS"
"""


def gpu_list(n: int) -> str:
    return "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:04d}-uuid)\n" for i in range(n))


MIG_LIST = (
    "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-0000-uuid)\n"
    "  MIG 3g.40gb     Device  0: (UUID: MIG-aaaa-0)\n"
    "  MIG 3g.40gb     Device  1: (UUID: MIG-aaaa-1)\n"
)

# `nvidia-smi -L` inside pods given MIG slices, UUIDs as published: the R470+ format as the AKS MIG
# guide prints it from its single- and mixed-strategy example pods (an A100 40GB PCIe in 1g.5gb
# slices), the older one from NVIDIA's "GPU Operator with MIG" (cloud-native-docs). A container
# given MIG slices lists their parent GPU too.
A100_PARENT = "GPU 0: NVIDIA A100 40GB PCIe (UUID: GPU-48aeb943-9458-4282-da24-e5f49e0db44b)\n"
SLICE_0 = "  MIG 1g.5gb     Device  0: (UUID: MIG-fb42055e-9e53-5764-9278-438605a3014c)\n"
SLICE_1 = "  MIG 1g.5gb     Device  1: (UUID: MIG-3d4db13e-c42d-5555-98f4-8b50389791bc)\n"
# drivers before R470 wrote a slice's UUID as MIG-<parent GPU UUID>/<GPU instance>/<compute instance>
OLD_FORMAT = (
    "GPU 0: A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f)\n"
    "  MIG 1g.5gb Device 0: (UUID: MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0)\n"
    "  MIG 1g.5gb Device 1: (UUID: MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/8/0)\n"
)


def container(pool: str = "h100", values=None) -> dict:
    docs = render(values or VALUES_BY_NAME["gpu-two-pools"])
    return workers(docs)[pool]["spec"]["template"]["spec"]["containers"][0]


def launch(tmp_path: Path, processes: int, kind: str = "cuda", gpus: str | None = None, **extra: str):
    c = container()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("decodebench-worker", FAKE_WORKER), ("nvidia-smi", FAKE_NVIDIA_SMI)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    (tmp_path / "jobs").mkdir()
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "LOG": str(tmp_path / "workers.log"),
        "JOBS": str(tmp_path / "jobs"),
        "FAKE_GPUS": gpus if gpus is not None else gpu_list(processes),
        "DECODEBENCH_WORKER_PROCESSES": str(processes),
        "DECODEBENCH_WORKER_DEVICE": kind,
        "DECODEBENCH_HEARTBEAT_DIR": str(tmp_path / "beats"),
        "DECODEBENCH_RESTART_BACKOFF": "1",
        "DECODEBENCH_RESTART_BACKOFF_MAX": "2",
        **extra,
    }
    proc = subprocess.Popen(
        [*c["command"], *c["args"]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, tmp_path / "workers.log"


def starts(log: Path) -> list[list[str]]:
    """Each start: [pid, CUDA_VISIBLE_DEVICES, argv...]."""
    if not log.exists():
        return []
    return [line.split()[1:] for line in log.read_text().splitlines() if line.startswith("start")]


def count(log: Path, word: str) -> int:
    return sum(line.startswith(word) for line in log.read_text().splitlines()) if log.exists() else 0


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def jobs(tmp_path: Path, device: str) -> int:
    path = tmp_path / "jobs" / device
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_each_process_sees_only_its_own_gpu_by_uuid_and_all_drain_on_sigterm(tmp_path):
    proc, log = launch(tmp_path, processes=8)
    wait_for(lambda: len(starts(log)) == 8)
    # CUDA_VISIBLE_DEVICES=<that GPU's UUID>, so cuda:0 is always that GPU, whatever order the device plugin used.
    assert sorted(s[1:] for s in starts(log)) == [
        [f"GPU-{i:04d}-uuid", "--device", "cuda:0", "--queues", "nlp-research", "safety"] for i in range(8)
    ]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.stderr.read()
    assert count(log, "term") == 8 and count(log, "done") == 8  # it exits only after every process finished


def test_a_crashing_process_restarts_with_backoff_while_the_others_keep_taking_jobs(tmp_path):
    proc, log = launch(tmp_path, processes=4, CRASH_DEVICE="GPU-0002-uuid")
    wait_for(lambda: [s[1] for s in starts(log)].count("GPU-0002-uuid") >= 2)
    before = {d: jobs(tmp_path, d) for d in ("GPU-0000-uuid", "GPU-0001-uuid", "GPU-0003-uuid")}
    wait_for(lambda: [s[1] for s in starts(log)].count("GPU-0002-uuid") >= 3)
    assert proc.poll() is None, "the pod stopped because one process crashed"
    devices = [s[1] for s in starts(log)]
    assert [devices.count(f"GPU-{i:04d}-uuid") for i in (0, 1, 3)] == [1, 1, 1]  # never restarted
    for device, n in before.items():
        assert jobs(tmp_path, device) > n, f"{device} stopped taking jobs"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    err = proc.stderr.read()
    assert "process 2 exited with status 3 (crash 1); restarting in 1s" in err
    assert "process 2 exited with status 3 (crash 2); restarting in 2s" in err  # doubling, up to the maximum


def test_exit_status_is_the_workers_not_always_zero(tmp_path):
    proc, log = launch(tmp_path, processes=2, TERM_STATUS="7")
    wait_for(lambda: len(starts(log)) == 2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 7
    assert "all workers stopped (status 7)" in proc.stderr.read()


def test_mig_slices_are_pinned_one_per_process(tmp_path):
    proc, log = launch(tmp_path, processes=2, kind="mig", gpus=MIG_LIST)
    wait_for(lambda: len(starts(log)) == 2)
    assert sorted((s[1], s[2], s[3]) for s in starts(log)) == [
        ("MIG-aaaa-0", "--device", "cuda:0"),
        ("MIG-aaaa-1", "--device", "cuda:0"),
    ]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


def pinned(tmp_path, processes: int, kind: str, gpus: str) -> list[str]:
    """The CUDA_VISIBLE_DEVICES of each process the launcher started for this `nvidia-smi -L`."""
    tmp_path.mkdir()
    proc, log = launch(tmp_path, processes=processes, kind=kind, gpus=gpus)
    try:
        wait_for(lambda: len(starts(log)) == processes or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read()
        return sorted(s[1] for s in starts(log))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_single_strategy_slices_advertised_as_gpus_are_pinned_as_slices_not_their_parent(tmp_path):
    # `single`: a pool asking nvidia.com/gpu: 2 on a MIG node gets two slices; the parent is listed too
    assert pinned(tmp_path / "two", 2, "cuda", A100_PARENT + SLICE_0 + SLICE_1) == [
        "MIG-3d4db13e-c42d-5555-98f4-8b50389791bc",
        "MIG-fb42055e-9e53-5764-9278-438605a3014c",
    ]
    # one slice: pinned to it, not to the parent GPU
    assert pinned(tmp_path / "one", 1, "cuda", A100_PARENT + SLICE_1) == ["MIG-3d4db13e-c42d-5555-98f4-8b50389791bc"]
    # slices of two parents, and the UUID format of drivers before R470
    two_parents = OLD_FORMAT + A100_PARENT.replace("GPU 0", "GPU 1") + SLICE_0
    assert pinned(tmp_path / "old", 3, "cuda", two_parents) == [
        "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0",
        "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/8/0",
        "MIG-fb42055e-9e53-5764-9278-438605a3014c",
    ]


def test_mixed_strategy_a_mig_profile_gets_its_slice_and_nvidia_gpu_its_whole_gpus(tmp_path):
    # `mixed`: nvidia.com/mig-1g.5gb: 1, as in NVIDIA's example pod
    assert pinned(tmp_path / "mig", 1, "mig", A100_PARENT + SLICE_0) == ["MIG-fb42055e-9e53-5764-9278-438605a3014c"]
    # nvidia.com/gpu on a mixed node: GPUs without MIG mode, listed without slices
    assert pinned(tmp_path / "gpu", 2, "cuda", gpu_list(2)) == ["GPU-0000-uuid", "GPU-0001-uuid"]


def test_a_mig_pool_given_whole_gpus_fails_clearly(tmp_path):
    proc, log = launch(tmp_path, processes=1, kind="mig", gpus=gpu_list(1))
    assert proc.wait(timeout=20) == 3
    assert "asks for MIG slices (gpuResource nvidia.com/mig-...) but nvidia-smi -L lists 1 whole GPU(s)" in (
        proc.stderr.read()
    )
    assert not starts(log)


def test_a_device_count_that_does_not_match_the_pool_fails_clearly(tmp_path):
    proc, log = launch(tmp_path, processes=4, kind="mig", gpus=MIG_LIST)
    assert proc.wait(timeout=20) == 3
    assert "expected 4 mig devices, nvidia-smi -L lists 2" in proc.stderr.read()
    assert not starts(log)


def probe(c: dict, which: str, beats: Path, processes: int) -> int:
    command = c[which]["exec"]["command"]
    env = {
        "PATH": os.environ["PATH"],
        "DECODEBENCH_HEARTBEAT_DIR": str(beats),
        "DECODEBENCH_WORKER_PROCESSES": str(processes),
    }
    return subprocess.run(command, env=env, capture_output=True, timeout=10).returncode


def test_probes_read_every_process_heartbeat(tmp_path):
    c = container()
    beats = tmp_path / "beats"
    beats.mkdir()
    for i in range(3):
        touch(str(beats / f"worker-{i}"))  # what the worker's heartbeat thread does
    assert [probe(c, p, beats, 3) for p in ("readinessProbe", "livenessProbe", "startupProbe")] == [0, 0, 0]
    stale = time.time() - 600
    os.utime(beats / "worker-1", (stale, stale))  # one process stopped beating (crashed, in backoff)
    assert probe(c, "readinessProbe", beats, 3) == 1  # not fully serving
    assert probe(c, "livenessProbe", beats, 3) == 0  # but the others live on: no restart of the container
    for i in (0, 2):
        os.utime(beats / f"worker-{i}", (stale, stale))
    assert probe(c, "livenessProbe", beats, 3) == 1
    assert probe(c, "readinessProbe", tmp_path / "none", 3) == 1


def test_cpu_pools_run_one_cpu_process_without_nvidia_smi(tmp_path):
    proc, log = launch(tmp_path, processes=1, kind="cpu", gpus="")
    wait_for(lambda: len(starts(log)) == 1)
    assert starts(log)[0][1:4] == ["none", "--device", "cpu"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


def ports(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [tuple(line.split()[1:]) for line in log.read_text().splitlines() if line.startswith("port ")]


def test_each_process_serves_metrics_on_its_own_port_also_after_a_restart(tmp_path):
    proc, log = launch(tmp_path, processes=4, CRASH_DEVICE="GPU-0002-uuid", DECODEBENCH_METRICS_PORT="9400")
    wait_for(lambda: len(ports(log)) >= 6)  # GPU 2's process restarted at least twice
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    assert set(ports(log)) == {(f"GPU-{i:04d}-uuid", str(9400 + i)) for i in range(4)}  # port + i, every start
    (tmp_path / "plain").mkdir()
    plain, plain_log = launch(tmp_path / "plain", processes=2)
    wait_for(lambda: len(ports(plain_log)) == 2)
    plain.send_signal(signal.SIGTERM)
    plain.wait(timeout=20)
    assert {port for _, port in ports(plain_log)} == {"0"}  # no metrics: the worker serves none
