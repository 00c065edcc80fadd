"""What result.json's `engine` says about how a job ran: every choice that makes cells comparable.

`engine_record(lm, plan, runtime, parts)` writes down the plan as it is (worker.engine.plan: path,
step, cache, prepared mask, refill, warm-up, rows per prompt) and, in the words results have always
used, the decoding loop, the batch size (fixed or auto, and what was probed), dtype, attention
kernels, KV cache, compilation, sampler, compactions, refills, energy source and modifiers.
"""

from __future__ import annotations

from typing import Any

from worker.core.contract import BatchTiming
from worker.engine.models import LoadedModel
from worker.engine.modifiers import any_set
from worker.engine.plan import Cache, Path, Plan
from worker.engine.telemetry import EnergyCounter


def _path_name(plan: Plan) -> str:
    """The path in the words result.json has always used."""
    if plan.path is Path.DECODE:
        step = f"{plan.step.describe}; " if plan.step.describe else ""
        refilled = ", free rows refilled" if plan.refill else ""
        return f"worker.engine.decode ({step}finished rows dropped{refilled})"
    return "transformers generate()"


def _modifiers(plan: Plan) -> str | None:
    if not any_set(plan.config):  # no penalty and no minimum length set
        return None
    if plan.path is Path.DECODE:
        return "per row: each generation's own tokens and steps (worker.engine.modifiers)"
    return "transformers generate()"


def engine_record(lm: LoadedModel, plan: Plan, runtime, parts: list) -> dict[str, Any]:
    """What result.json's `engine` says about how the job ran (`parts`: the job's BatchOutputs)."""
    timings: list[BatchTiming] = [part.timing for part in parts]
    compactions = [t.compactions for t in timings if t.compactions is not None]
    energy = [t.energy_j for t in timings]
    cache = plan.config.cache_implementation or "dynamic"
    preallocated = bool(parts) and plan.cache is Cache.PREALLOCATED
    if preallocated:
        cache = "preallocated (worker.engine.kvcache: one buffer per batch, written in place)"
    return {
        "plan": plan.record(),
        "decode_loop": _path_name(plan),
        "batch_size": dict(plan.batches.record) if plan.batches is not None else None,
        "dtype": lm.info["dtype"],
        "attention": lm.info.get("attention"),
        "kv_cache": cache,
        "compiled": cache == "static" and runtime.device.type == "cuda",
        "sampler": plan.describe().get("decodebench_sampler", {}).get("method"),
        "compactions": sum(compactions) if compactions else None,
        "refills": sum(t.refills for t in timings if t.refills is not None) if plan.refill else None,
        "energy": EnergyCounter.source if energy and all(e is not None for e in energy) else None,
        "modifiers": _modifiers(plan),
        "decode_mask": "prepared 4D boolean (no per-step rebuild)" if preallocated and plan.mask else None,
        "prompt_tokenisation": "once per job",
    }
