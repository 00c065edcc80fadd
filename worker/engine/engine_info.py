"""The engine's choices for a job: `batch_size: auto` on the loaded model, and their record in result.json.

`auto_batch_size` and `auto_groups` wire `worker.engine.batching`'s probes to a loaded model and the job's
lengths; `engine_record` writes down every choice that makes cells comparable (decoding
loop, batch size, bucketing, dtype, attention kernels, KV cache, compilation, sampler,
compactions, energy source).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from worker.core import settings
from worker.core.contract import BatchTiming, JobSpec
from worker.engine import batching
from worker.engine import generate as gen
from worker.engine.decode import prepared_mask, stream_span
from worker.engine.kvcache import preallocated_cache
from worker.engine.models import LoadedModel
from worker.engine.modifiers import build_modifiers
from worker.engine.telemetry import EnergyCounter


def _cpu_probe(lm: LoadedModel, decoding, job: JobSpec, order: list[int]):
    """Seconds per generated token at a given size, from a short batch of the longest prompts.

    The probe runs a few steps; its prefill and per-step decode times are extrapolated to
    the job's max_new_tokens (a real batch pays one prefill over many steps, so timing the
    short run as it is would favour small batches, whose prefill is cheaper).
    """
    max_new = job.generation.max_new_tokens
    steps = min(batching.CPU_PROBE_STEPS, max_new)
    config = decoding.config.__class__(**{**decoding.config.to_dict(), "max_new_tokens": steps})
    config.min_new_tokens = steps
    short = dataclasses.replace(decoding, config=config)

    def run(size: int) -> float:
        prompts = [job.prompts[i] for i in order[:size]]
        timings = [gen.generate_batch(lm, short, prompts, [0] * size).timing for _ in range(2)]
        prefill = min(t.prefill_s for t in timings)
        per_step = min(t.decode_s for t in timings) / max(steps - 1, 1)
        return (prefill + per_step * (max_new - 1)) / (size * max_new)

    return run


def probe_length(decoding, longest: int, max_new: int, every: int) -> int:
    """The sequence length the CUDA probe fits: the longest prompt's bucket plus the new tokens, or
    for a continuous-refill stream the columns of its KV buffers (decode.stream_span; `every`: steps
    between the loop's checks)."""
    bucket = batching.length_bucket(longest)
    return stream_span(bucket, max_new, every) if decoding.refill else bucket + max_new


def loop_peak(lm: LoadedModel, decoding, longest: int) -> batching.LoopPeak | None:
    """What the CUDA probe runs in the own loop's preallocated KV buffers (a prefill of the longest prompt's
    bucket; for a stream, an admission's too), or None where the job runs elsewhere (generate(), a
    strategy's batch loop) or the model's cache is transformers' own: there the probe is one forward
    pass of the whole length."""
    if not decoding.own_loop or preallocated_cache(lm.model, 1) is None:
        return None
    return batching.LoopPeak(batching.length_bucket(longest), stream=decoding.refill)


def auto_batch_size(runtime, lm: LoadedModel, decoding, job: JobSpec, lengths: list[int]) -> tuple[int, dict]:
    """`batch_size: auto`: the probed size for this model, device and lengths (cached in the runtime).

    `lengths`: the job's prompts' token lengths; on CUDA, whose probe reads only the longest and how
    many there are, those of any part of the job (auto_groups asks per length bucket)."""
    cap = max(1, min(len(lengths), settings.get("auto_batch_max")))
    longest = max(lengths)
    # a step of the own loop may say otherwise (contrastive search's candidates share their row's cache)
    each = getattr(decoding.step, "cache_rows", None)
    rows_each = each or batching.rows_per_prompt(decoding.config, job.strategy.params)
    max_new = job.generation.max_new_tokens
    key = (
        runtime.cache.key(job.model, runtime.device),
        batching.length_bucket(longest),
        max_new,
        rows_each,
        cap,
        decoding.refill,
    )

    def probe() -> tuple[int, dict[str, Any]]:
        if runtime.device.type == "cuda":
            length = probe_length(decoding, longest, max_new, gen.check_every(runtime.device))
            peak = loop_peak(lm, decoding, longest)
            size, probed = batching.cuda_fit(lm.model, runtime.device, length, rows_each, cap, peak)
            if peak is None:
                how = "largest batch whose forward pass of prompt + new tokens fits"
            else:
                admission = ", an admission's prefill" if peak.stream else ""
                how = (
                    f"{batching.HEADROOM:.0%} of the largest batch that fits its KV buffers of {length} columns,"
                    f" a prefill of {peak.prompt} tokens{admission}, a decode step and the sampling tensors"
                )
            how += " (a stream's KV buffers)" if decoding.refill else ""
            return size, {"how": how, "fits": probed}
        order = batching.longest_first(lengths)  # indices into job.prompts: the CPU probe times them
        size, rates = batching.cpu_fastest(_cpu_probe(lm, decoding, job, order), cap)
        return size, {"how": "fastest tokens/s in a short probe of the longest prompts", "tokens_per_s": rates}

    return runtime.batch_sizes.size(key, probe)


def auto_groups(runtime, lm: LoadedModel, decoding, job: JobSpec, lengths: list[int]):
    """`batch_size: auto` for a job: its prompts' indices in groups with their sizes, longest first, and the
    record. On CUDA each length bucket is probed and may start a group (batching.length_groups); on the
    CPU, where speed and not memory sets the size, one probe of the longest prompts sizes the job."""
    if runtime.device.type != "cuda":
        size, probe = auto_batch_size(runtime, lm, decoding, job, lengths)
        return [(size, batching.longest_first(lengths))], {"auto": probe, "used": size}
    probes: list[tuple[int, int, dict]] = []

    def size_for(rest: list[int]) -> int:
        size, probe = auto_batch_size(runtime, lm, decoding, job, rest)
        probes.append((max(rest), size, probe))
        return size

    groups = batching.length_groups(lengths, size_for)
    info: dict[str, Any] = {"auto": probes[0][2], "used": max(size for size, _ in groups)}
    if len(probes) > 1:
        info["buckets"] = [{"longest": n, "batch_size": size, "fits": p.get("fits")} for n, size, p in probes]
    if len(groups) > 1:
        info["groups"] = [
            {"batch_size": size, "prompts": len(ix), "longest": max(lengths[i] for i in ix)} for size, ix in groups
        ]
    return groups, info


def _loop_name(decoding) -> str:
    if decoding.own_loop:
        step = f"{decoding.step.describe}; " if decoding.step else ""
        refilled = ", free rows refilled" if decoding.refill else ""
        return f"worker.engine.decode ({step}finished rows dropped{refilled})"
    if decoding.loop is not None:
        return f"decodebench's own loop ({decoding.loop})"
    return "transformers generate()"


def _modifiers(decoding) -> str | None:
    if not build_modifiers(decoding.config, 0):  # no penalty and no minimum length set
        return None
    if decoding.own_loop:
        return "per row: each generation's own tokens and steps (worker.engine.modifiers)"
    if decoding.loop is not None:
        return "transformers' processors, repetition penalty without the padding (worker.engine.modifiers)"
    return "transformers generate()"


def engine_record(lm: LoadedModel, decoding, runtime, batch_info: dict, parts: list) -> dict[str, Any]:
    """What result.json's `engine` says about how the job ran (`parts`: the job's BatchOutputs)."""
    timings: list[BatchTiming] = [part.timing for part in parts]
    compactions = [t.compactions for t in timings if t.compactions is not None]
    energy = [t.energy_j for t in timings]
    cache = decoding.config.cache_implementation or "dynamic"
    preallocated = bool(parts) and all(part.kv_cache == "preallocated" for part in parts)
    if preallocated:
        cache = "preallocated (worker.engine.kvcache: one buffer per batch, written in place)"
    return {
        "decode_loop": _loop_name(decoding),
        "batch_size": batch_info,
        "dtype": lm.info["dtype"],
        "attention": lm.info.get("attention"),
        "kv_cache": cache,
        "compiled": cache == "static" and runtime.device.type == "cuda",
        "sampler": decoding.describe().get("decodebench_sampler", {}).get("method"),
        "compactions": sum(compactions) if compactions else None,
        "refills": sum(t.refills for t in timings if t.refills is not None) if decoding.refill else None,
        "energy": EnergyCounter.source if energy and all(e is not None for e in energy) else None,
        "modifiers": _modifiers(decoding),
        "decode_mask": "prepared 4D boolean (no per-step rebuild)"
        if preallocated and prepared_mask(lm.model)
        else None,
        "prompt_tokenisation": "once per job",
    }
