"""The GPU section of benchmarks/bench_throughput.py (run with `--device cuda:N`).

A GPT-2-sized model (GPT2Config's defaults: 12 layers, 768 wide, 50,257-token vocabulary,
124M parameters) built from its config with random weights, saved in bfloat16 with the
bundled tokenizer (its ids are a subset of the vocabulary; generated ids beyond it decode
to nothing, which changes no timing). For several strategies, at batch size 1 (on a few
prompts) and at `batch_size: auto` (on more: a job of a sweep cell, so that auto can pick a
batch larger than a handful of prompts): tokens/s, ms per token (decode time per step,
after the first token), peak torch memory, and at batch size 1 the fraction of the memory-bandwidth bound
(weight bytes x tokens/s / the device's memory bandwidth): decoding one row reads every
weight once per token, so that fraction says how close the engine is to the hardware.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.jobs import job
from worker.core.contract import PromptItem
from worker.engine.job import generate_job

STRATEGIES = [
    ("greedy", {}),
    ("top_p", {"p": 0.9}),
    ("beam", {"num_beams": 4}),
    ("contrastive", {"k": 4, "alpha": 0.6}),
]


def memory_bandwidth(device) -> tuple[float | None, str]:
    """Bytes/s of the device's memory: 2 x memory clock x bus width (double data rate), from torch or NVML."""
    if torch.device(device).type != "cuda":
        return None, "not a CUDA device"
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8, "torch device properties: 2 x memory clock x bus width"
    try:
        import pynvml

        from worker.engine.telemetry import nvml_handle

        handle = nvml_handle(device)
        clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        bus = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        return 2 * clock_mhz * 1e6 * bus / 8, "NVML: 2 x max memory clock x bus width"
    except Exception:
        return None, "unknown"


def build_model(folder: Path, tokenizer_from: str, **shape) -> tuple[str, int]:
    """A random-weight GPT-2 (124M, or `shape`'s GPT2Config sizes) in bfloat16 with the bundled tokenizer;
    its path and weight bytes."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(bos_token_id=0, eos_token_id=0, pad_token_id=0, **shape)
    model = GPT2LMHeadModel(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(folder)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return str(folder), nbytes


def _row(result, weight_bytes: int, bandwidth: float | None, batch_size) -> dict:
    batches = result.batches
    total = sum(b.total_s for b in batches)
    decode_steps = sum(max((b.steps or 1) - 1, 0) for b in batches)
    tokens_per_s = result.new_tokens / total if total > 0 else None
    row = {
        "batch_size": result.engine["batch_size"]["used"],
        "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s else None,
        "ms_per_token": round(sum(b.decode_s for b in batches) * 1000 / decode_steps, 3) if decode_steps else None,
        "peak_memory_mb": result.memory.get("torch_peak_mb"),
        "joules_per_1k_tokens": None,
        "decode_loop": result.engine["decode_loop"],
    }
    if "groups" in result.engine["batch_size"]:  # auto sized the job's length buckets apart
        row["batch_groups"] = result.engine["batch_size"]["groups"]
    energy = [b.energy_j for b in batches]
    if energy and None not in energy and result.new_tokens:
        row["joules_per_1k_tokens"] = round(sum(energy) * 1000 / result.new_tokens, 3)
    if batch_size == 1 and bandwidth and tokens_per_s:
        row["bandwidth_bound_fraction"] = round(weight_bytes * tokens_per_s / bandwidth, 3)
    return row


def gpu_section(
    runtime,
    tokenizer_from: str,
    prompts: list[PromptItem],
    budget_s: float = 240.0,
    max_new: int = 64,
    auto_prompts: list[PromptItem] | None = None,
    **shape,
):
    """Every strategy at batch size 1 on `prompts` and at auto on `auto_prompts` (default: the same), within
    `budget_s` (strategies left over are listed as skipped).

    `shape` (GPT2Config sizes) shrinks the model: the CPU suite runs the section that way, so
    that its code has run before a GPU host's few minutes are spent on it.
    """
    start = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="decodebench-gpt2-"))
    try:
        model, weight_bytes = build_model(folder, tokenizer_from, **shape)
        bandwidth, how = memory_bandwidth(runtime.device)
        out = {
            "model": "GPT-2 from GPT2Config, random weights, bfloat16" + (f", {shape}" if shape else " (124M)"),
            "weight_bytes": weight_bytes,
            "memory_bandwidth_gb_s": round(bandwidth / 1e9, 1) if bandwidth else None,
            "bandwidth_source": how,
            "new_tokens_per_prompt": max_new,
            "prompts": {"1": len(prompts), "auto": len(auto_prompts or prompts)},
            "rows": {},
            "skipped": [],
        }
        for name, params in STRATEGIES:
            for batch_size in (1, "auto"):
                label = f"{name}@{batch_size}"
                if time.perf_counter() - start > budget_s:
                    out["skipped"].append(label)
                    continue
                these = prompts if batch_size == 1 else (auto_prompts or prompts)
                spec = job(
                    model, these, name, params, batch_size, max_new, min_new=max_new, dtype="bfloat16", warmup=True
                )
                result, _ = generate_job(spec, runtime)
                out["rows"][label] = _row(result, weight_bytes, bandwidth, batch_size)
                print(f"gpu {label:18s} {out['rows'][label]}")
        out["seconds"] = round(time.perf_counter() - start, 1)
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)
