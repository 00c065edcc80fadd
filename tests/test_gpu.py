"""Checks that need CUDA: run on a GPU machine (`scripts/device-checks.sh`), skipped elsewhere.

They cover what the CPU suite cannot: explicit device pinning (cuda:N, UUIDs through
CUDA_VISIBLE_DEVICES), torch peak memory and NVML sampling in results, reduced
and reduced precision. (Batch halving on CUDA out-of-memory is checked on the CPU in
test_engine.py, with the error raised by a fault injected into generate_batch.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from worker.core.contract import GenerationSettings, JobSpec, ModelSpec, PromptItem, StrategySpec
from worker.engine.job import Runtime, generate_job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/device-checks.sh)")

PROMPTS = ["It was a truth universally acknowledged that", "She had never seen", "Anne", "The morning was fine, and"]


def job(model: str, strategy: str = "greedy", dtype: str = "auto", batch_size: int = 4, max_new: int = 16) -> JobSpec:
    return JobSpec(
        tenant="default",
        sweep_id="s",
        sweep_name="gpu",
        job_id=f"gpu-{strategy}-{dtype}-{batch_size}",
        cell="m::x",
        model=ModelSpec(path=model, dtype=dtype),
        strategy=StrategySpec(name=strategy),
        seed=0,
        shard=0,
        n_shards=1,
        prompts=[PromptItem(id=f"p{i}", prompt=p) for i, p in enumerate(PROMPTS)],
        generation=GenerationSettings(max_new_tokens=max_new, batch_size=batch_size),
        metrics=["perplexity"],
    )


@pytest.fixture(scope="module")
def cuda_runtime():
    return Runtime("cuda:0")


def test_result_records_device_uuid_torch_peak_and_nvml(small_model, cuda_runtime):
    result, records = generate_job(job(small_model), cuda_runtime)
    device = result.provenance["device"]
    assert device["type"] == "cuda" and device["name"] and device["uuid"].startswith("GPU-")
    assert device["driver"] and device["cuda"]
    assert result.memory["torch_peak_mb"] > 0
    assert result.memory["nvml_peak_mb"] > 0 and result.memory["gpu_util_mean"] is not None
    assert all(r.nll_sum is not None for r in records)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reduced_precision_generates_and_matches_float32_mostly(small_model, cuda_runtime, dtype):
    _, full = generate_job(job(small_model, dtype="float32"), cuda_runtime)
    result, half = generate_job(job(small_model, dtype=dtype), cuda_runtime)
    assert result.provenance["model"]["dtype"] == dtype
    same = sum(a.token_ids[:4] == b.token_ids[:4] for a, b in zip(full, half))
    assert same >= len(full) // 2  # near-ties may flip; most greedy prefixes agree


def test_seeded_sampling_reproducible_on_gpu(small_model, cuda_runtime):
    a = [r.text for r in generate_job(job(small_model, "top_p"), cuda_runtime)[1]]
    b = [r.text for r in generate_job(job(small_model, "top_p"), cuda_runtime)[1]]
    assert a == b


def test_worker_pins_by_uuid_and_refuses_missing_device(small_model):
    uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    code = "from worker.engine.job import Runtime; r = Runtime('cuda:0'); print(r.device_info['uuid'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == uuid
    n = torch.cuda.device_count()
    exe = os.path.join(os.path.dirname(sys.executable), "decodebench-worker")
    bad = subprocess.run([exe, "--device", f"cuda:{n}", "--burst"], capture_output=True, text=True)
    assert bad.returncode == 2 and f"only {n} CUDA device(s) visible" in bad.stderr


def test_cuda_timing_records_events_without_a_sync_per_step(small_model, cuda_runtime, monkeypatch):
    """The step clock records CUDA events and synchronises once per batch, at its end."""
    syncs = []
    real = torch.cuda.Event.synchronize
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: syncs.append(1) or real(self))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("host sync during generation"))
    result, _ = generate_job(
        job(small_model, max_new=16).model_copy(
            update={"generation": GenerationSettings(max_new_tokens=16, batch_size=4, warmup=False)}
        ),
        cuda_runtime,
    )
    (batch,) = result.batches
    assert len(syncs) == 1 and batch.steps and 0 < batch.prefill_s < batch.total_s
