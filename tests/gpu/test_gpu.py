"""Checks that need CUDA: run on a GPU machine (`scripts/device-checks.sh`), skipped elsewhere.

They cover what the CPU suite cannot: explicit device pinning (cuda:N, UUIDs through
CUDA_VISIBLE_DEVICES), torch peak memory and NVML sampling in results, reduced
precision, and the throughput engine: compaction, auto batch size, energy, the static
cache with torch.compile and the GPU benchmark section. (Batch halving on CUDA
out-of-memory is checked on the CPU in test_engine.py, with the error raised by a fault
injected into run_batch.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.support.engine import job as engine_spec
from worker.core.contract import GenerationSettings, JobSpec, ModelSpec, PromptItem, StrategySpec
from worker.engine.job import Runtime, generate_job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/device-checks.sh)")

PROMPTS = ["It was a truth universally acknowledged that", "She had never seen", "Anne", "The morning was fine, and"]


def job(model: str, strategy: str = "greedy", dtype: str = "auto", batch_size: int = 4, max_new: int = 16) -> JobSpec:
    """The GPU checks' job: four prompts, scored (perplexity)."""
    return engine_spec(
        model,
        strategy,
        batch_size=batch_size,
        max_new=max_new,
        metrics=["perplexity"],
        prompts=PROMPTS,
        dtype=dtype,
        job_id=f"gpu-{strategy}-{dtype}-{batch_size}",
    )


@pytest.fixture(scope="module")
def cuda_runtime():
    return Runtime("cuda:0")


def test_attention_leaves_cudnn_off_unless_asked(small_model, cuda_runtime):
    """cuDNN's fused attention builds a plan per new shape, and a decode step's key length is new every step:
    on an H200 a batch of 128 decoded 13x slower per step the first time (benchmarks/bench_sdpa_cold.py).
    The runtime turns it off for its process unless DECODEBENCH_SDPA_CUDNN asks, and records which."""
    from worker.engine.job import EngineSettings

    assert cuda_runtime.device_info["sdpa_cudnn"] is False and not torch.backends.cuda.cudnn_sdp_enabled()
    try:
        assert Runtime("cuda:0", EngineSettings(sdpa_cudnn=True)).device_info["sdpa_cudnn"] is True
    finally:
        Runtime("cuda:0")  # the module's runtime's setting again
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    result, _ = generate_job(job(small_model), cuda_runtime)
    assert result.provenance["device"]["sdpa_cudnn"] is False


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
    from worker.engine.device import device_info

    uuid = device_info(torch.device("cuda", 0))["uuid"]  # GPU-… or, on a MIG slice, MIG-…
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    code = "from worker.engine.job import Runtime; r = Runtime('cuda:0'); print(r.device_info['uuid'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == uuid
    n = torch.cuda.device_count()
    worker = [sys.executable, "-m", "worker.cli"]  # decodebench-worker, installed or not
    bad = subprocess.run([*worker, "--device", f"cuda:{n}", "--burst"], capture_output=True, text=True)
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


# -- the throughput engine on CUDA ----------------------------------------------------------------

MIXED = [*PROMPTS, "It was the best of times, it was the worst of times, it was the age of wisdom, it was", "Emma"]


def engine_job(model: str, strategy: str = "greedy", params=None, **generation) -> JobSpec:
    settings = {"max_new_tokens": 24, "batch_size": len(MIXED), "stop": ["."], **generation}
    return job(model, strategy).model_copy(
        update={
            "strategy": StrategySpec(name=strategy, params=params or {}),
            "model": ModelSpec(path=model, dtype="float32"),
            "prompts": [PromptItem(id=f"m{i}", prompt=p) for i, p in enumerate(MIXED)],
            "generation": GenerationSettings(**settings),
            "metrics": ["distinct_1"],
        }
    )


def test_compacting_loop_on_cuda_matches_unbatched_greedy_and_seeded_samples(small_model, cuda_runtime):
    batched, records = generate_job(engine_job(small_model), cuda_runtime)
    assert batched.engine["decode_loop"].startswith("worker.engine.decode")
    _, alone = generate_job(engine_job(small_model, batch_size=1), cuda_runtime)
    assert [r.token_ids for r in records] == [r.token_ids for r in alone]
    _, sampled = generate_job(engine_job(small_model, "top_k", {"k": 20}), cuda_runtime)
    _, sampled_alone = generate_job(engine_job(small_model, "top_k", {"k": 20}, batch_size=1), cuda_runtime)
    same = sum(a.token_ids == b.token_ids for a, b in zip(sampled, sampled_alone))
    assert same >= len(sampled) - 1  # float32 on GPU: a rare near-tie of the CDF may flip one draw


@pytest.mark.parametrize(
    "strategy,params",
    [
        ("greedy", None),
        ("top_p", {"p": 0.9}),
        ("min_p", {"p": 0.1}),
        ("greedy", {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3}),  # penalties row by row
    ],
)
def test_decode_steps_never_synchronise_the_host_on_cuda(small_model, cuda_runtime, monkeypatch, strategy, params):
    """A step's forward and token pick queue kernels only (the prepared mask spares transformers' padding check);
    the loop waits for the GPU at its checks, every 8 steps, and nowhere else."""
    from worker.engine.call import ModelCall
    from worker.engine.choose import Chooser

    steps = []

    def no_sync(method):
        def run(self, *args, **kwargs):
            steps.append(method.__name__)
            torch.cuda.set_sync_debug_mode("error")  # a synchronising CUDA call raises here
            try:
                return method(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        return run

    for cls, name in ((ModelCall, "forward"), (Chooser, "advance")):
        monkeypatch.setattr(cls, name, no_sync(getattr(cls, name)))
    spec = engine_job(small_model, strategy, params, batch_size=2, max_new_tokens=32, min_new_tokens=4)
    result, records = generate_job(spec, cuda_runtime)
    assert steps.count("forward") >= 32 and result.batches[0].refills >= 1 and len(records) == len(MIXED)


def _syncs(run) -> int:
    """How many synchronising CUDA calls `run()` makes (torch's sync debug mode, set to warn)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.parametrize(
    "strategy,params,stop",
    [
        ("greedy", None, ["."]),
        ("top_p", {"p": 0.9}, []),
        ("beam", {"num_beams": 4}, [","]),
        ("diverse_beam", {"num_beams": 4, "num_beam_groups": 2}, []),
        ("contrastive", {"k": 4, "alpha": 0.6}, ["."]),
    ],
)
def test_no_loop_synchronises_the_host_per_step_on_cuda(small_model, cuda_runtime, strategy, params, stop):
    """Every loop of the engine (the own loop, the beam loop, contrastive search), the whole job around it
    included: 32 more decode steps add at most the synchronisations of the 4 more checks (a look every 8
    steps), never one per step. Measured as the difference between a 48- and a 16-token job of the same
    prompts, so the job's fixed synchronisations (prefill, copies back, the clock's one) cancel."""

    def job_of(n: int):
        spec = engine_job(small_model, strategy, params, max_new_tokens=n, min_new_tokens=n, stop=stop)
        return lambda: generate_job(spec, cuda_runtime)

    assert _syncs(lambda: torch.ones(1, device=cuda_runtime.device).item()) >= 1  # the count sees a sync
    job_of(16)()  # warm: kernels, the mask check, the stop table on the device
    extra = _syncs(job_of(48)) - _syncs(job_of(16))
    assert extra <= 16, f"{extra} more synchronisations for 32 more steps"  # one per step would add >= 32


def test_continuous_refill_on_cuda_matches_unbatched_greedy(small_model, cuda_runtime):
    streamed, records = generate_job(engine_job(small_model, batch_size=2), cuda_runtime)
    (stream,) = streamed.batches
    assert stream.refills >= 1 and len(stream.latency_s) == len(MIXED)
    _, alone = generate_job(engine_job(small_model, batch_size=1), cuda_runtime)
    same = sum(a.token_ids == b.token_ids for a, b in zip(records, alone))
    assert same >= len(records) - 1  # float32 on GPU: a rare near-tie may flip one row


def test_a_stream_on_cuda_slides_its_kv_window_within_buffers_that_never_grow(small_model, cuda_runtime):
    """The stream's buffers with the fewest columns its bound allows (the window slides whenever it can),
    checks every 8 steps as on any CUDA run: no buffer grows, and rows are still their unbatched runs."""
    from tests.support.engine import forbid_growth

    with forbid_growth(tight=True) as slides:
        streamed, records = generate_job(engine_job(small_model, batch_size=2, max_new_tokens=32), cuda_runtime)
    assert streamed.batches[0].refills >= 1 and any(slides)
    _, alone = generate_job(engine_job(small_model, batch_size=1, max_new_tokens=32), cuda_runtime)
    same = sum(a.token_ids == b.token_ids for a, b in zip(records, alone))
    assert same >= len(records) - 1  # float32 on GPU: a rare near-tie may flip one row


def test_beam_search_in_the_beam_loop_on_cuda_matches_generate(small_model, cuda_runtime, monkeypatch):
    """The `beam` strategy in the engine's beam loop (prompts that are done leave the pass) against
    generate()'s beam search, float32 on CUDA."""
    from worker.engine.loops import beam as beam_loop

    spec = engine_job(small_model, "beam", {"num_beams": 4}, stop=[","])
    ours_result, ours = generate_job(spec, cuda_runtime)
    assert "worker.engine.loops.beam" in ours_result.engine["decode_loop"]
    monkeypatch.setattr(beam_loop, "supports", lambda config: False)
    _, theirs = generate_job(spec, cuda_runtime)
    same = sum(a.token_ids == b.token_ids for a, b in zip(ours, theirs))
    assert same >= len(ours) - 1  # float32 on GPU: the loop's smaller batches may flip a near-tie


def test_contrastive_candidates_over_their_rows_cache_on_cuda_choose_as_repeated_caches(
    small_model, cuda_runtime, monkeypatch
):
    """Contrastive search's shared-cache step (k candidates as tokens of their row) against the repeated
    cache of the original implementation, float32 on CUDA."""
    from worker.engine import plan as planning

    spec = engine_job(small_model, "contrastive", {"k": 4, "alpha": 0.6}, stop=[","])
    _, shared = generate_job(spec, cuda_runtime)
    monkeypatch.setattr(planning, "prepared_mask", lambda model: False)
    _, repeated = generate_job(spec, cuda_runtime)
    same = sum(a.token_ids == b.token_ids for a, b in zip(shared, repeated))
    assert same >= len(shared) - 1  # float32 on GPU: the two steps' rounding may flip a near-tie


@pytest.mark.parametrize("stop", [["."], [".", " the"]], ids=repr)
def test_stop_strings_by_lookup_on_cuda_answer_as_transformers_criteria(small_model, stop):
    """On CUDA there is no host shortcut: the lookup where exact, transformers' check otherwise."""
    from transformers import AutoTokenizer
    from transformers.generation.stopping_criteria import StopStringCriteria

    from worker.engine.stops import StopStrings

    tok = AutoTokenizer.from_pretrained(small_model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.randint(0, len(tok), (len(tok), 7), generator=gen), torch.arange(len(tok))[:, None]], 1)
    theirs = StopStringCriteria(tok, stop)(ids, None)
    ours = StopStrings(tok, stop)(ids.cuda(), None)
    assert ours.is_cuda and torch.equal(ours.cpu(), theirs) and bool(theirs.any())


def test_auto_batch_size_probes_cuda_memory_once(small_model, cuda_runtime):
    spec = engine_job(small_model, batch_size="auto")
    result, records = generate_job(spec, cuda_runtime)
    info = result.engine["batch_size"]
    assert info["requested"] == "auto" and info["used"] >= 1 and len(records) == len(MIXED)
    assert info["auto"]["fits"] and "fits" in info["auto"]["how"] and not info["auto"]["cached"]
    assert generate_job(spec, cuda_runtime)[0].engine["batch_size"]["auto"]["cached"]


def test_auto_on_cuda_sizes_length_buckets_apart_and_changes_no_token(small_model, cuda_runtime, monkeypatch):
    """The fit probes run on this GPU, capped (1 row for the longest prompt's bucket, 2 for the rest) so that
    the job runs in two groups, the second a stream of 2 rows: every token is the fixed batch's."""
    from worker.engine import batching
    from worker.engine.decode import stream_span

    real = batching.cuda_fit
    long = stream_span(32, 20, 8)  # the probe's length for the bucket of MIXED's longest prompt

    def capped(model, device, length, each, cap, peak=None):
        return real(model, device, length, each, min(cap, 1 if length >= long else 2), peak)

    monkeypatch.setattr(batching, "cuda_fit", capped)
    _, fixed = generate_job(engine_job(small_model, max_new_tokens=20), cuda_runtime)
    result, grouped = generate_job(engine_job(small_model, max_new_tokens=20, batch_size="auto"), cuda_runtime)
    info = result.engine["batch_size"]
    # buckets 32, 16, 8 and 4 probed (the last two could still have fitted 3 or 4 rows); 2 and 1 not
    assert [g["batch_size"] for g in info["groups"]] == [1, 2]
    assert [b["batch_size"] for b in info["buckets"]] == [1, 2, 2, 2]
    assert [b.batch_size for b in result.batches] == [1, 2]
    assert [r.token_ids for r in grouped] == [r.token_ids for r in fixed]


def test_energy_per_batch_from_nvml_where_the_gpu_counts_it(small_model, cuda_runtime):
    from worker.engine.telemetry import EnergyCounter

    if EnergyCounter(cuda_runtime.device).read() is None:
        pytest.skip("this GPU or driver has no NVML total-energy counter")
    result, _ = generate_job(engine_job(small_model, max_new_tokens=64, stop=[]), cuda_runtime)
    assert all(b.energy_j is not None and b.energy_j >= 0 for b in result.batches)
    assert result.engine["energy"].startswith("nvml")


def test_static_cache_compiles_on_cuda_and_changes_no_greedy_token(small_model, cuda_runtime):
    _, dynamic = generate_job(engine_job(small_model, stop=[]), cuda_runtime)
    result, static = generate_job(engine_job(small_model, stop=[], static_cache=True), cuda_runtime)
    assert result.engine["kv_cache"] == "static" and result.engine["compiled"] is True
    same = sum(a.token_ids == b.token_ids for a, b in zip(dynamic, static))
    assert same >= len(static) - 1  # compiled kernels may flip a rare near-tie


def test_gpu_benchmark_section_reports_speed_memory_and_bandwidth_fraction(small_model, cuda_runtime):
    from benchmarks.throughput_gpu import STRATEGIES, gpu_section

    prompts = [PromptItem(id=f"b{i}", prompt=p) for i, p in enumerate(PROMPTS)]
    out = gpu_section(cuda_runtime, small_model, prompts, budget_s=120, max_new=8)
    assert out["memory_bandwidth_gb_s"] and out["weight_bytes"] > 2e8
    assert len(out["rows"]) + len(out["skipped"]) == 2 * len(STRATEGIES)
    row = out["rows"]["greedy@1"]
    assert row["tokens_per_s"] > 0 and row["peak_memory_mb"] > 0 and 0 < row["bandwidth_bound_fraction"] < 1.5


def test_nvml_and_the_launcher_find_this_device_by_the_uuid_cuda_reports():
    """Whole GPU or MIG slice: NVML finds cuda:0 by CUDA's UUID (worker.core.nvml) and the pod launcher's
    reading of this host's real `nvidia-smi -L` lists that UUID (tests/unit/worker/core/test_mig.py fakes both on
    the CPU)."""
    from worker.engine.telemetry import Sampler, telemetry_scope

    device = torch.device("cuda", 0)
    scope = telemetry_scope(device)
    assert scope["nvml_uuid"] and scope["nvml_uuid"].endswith(str(torch.cuda.get_device_properties(0).uuid))
    assert scope["nvml_uuid"].startswith("MIG-" if scope["mig"] else "GPU-")
    with Sampler(device) as sampler:
        pass
    summary = sampler.summary()
    assert summary["nvml_peak_mb"] is not None
    assert (summary["gpu_util_mean"] is None) == scope["mig"]  # none on a slice, sampled on a whole GPU
    launcher = "charts/decodebench/files/launch-workers.sh"
    script = f"source <(sed -n '/^list_devices()/,/^}}/p' {launcher}); nvidia-smi -L | list_devices"
    listed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert scope["nvml_uuid"] in listed
