"""What result.json says about how a job ran: the one place the plan is written down.

`generation_config(plan)` is result.json's `generation_config` (the transformers config with what the
engine adds: the chooser's parameters, the assistant, the loop, the sampler); `engine_record(lm, plan,
batches, runtime, parts)` its `engine`: the plan as it is (worker.engine.plan: path, chooser, cache,
prepared mask, refill, warm-up, rows per prompt: `plan_record`) and, in the words results have
always used, the decoding loop, the batch size (fixed or auto, and what was probed), dtype,
attention kernels, KV cache, compilation, sampler, compactions, refills, energy source and
modifiers. Its `provenance` is worker.engine.provenance's, for both engines.
"""

from __future__ import annotations

from typing import Any

from worker.core.results import BatchTiming
from worker.engine.graphs import StepStats
from worker.engine.loops.beam_step import BeamStep
from worker.engine.loops.contrastive import ContrastiveStep
from worker.engine.models import LoadedModel
from worker.engine.modifiers import any_set
from worker.engine.plan import BatchPlan, Cache, Path, Plan
from worker.engine.sampling import SeededSampler
from worker.engine.telemetry import EnergyCounter
from worker.strategies import Kind

# the choosers result.json names in its decode loop, in the words results have always used
CHOOSERS = {
    ContrastiveStep: "contrastive search's step (worker.engine.loops.contrastive)",
    BeamStep: "beam search's step (worker.engine.loops.beam_step)",
}
OWN_PARAMS = frozenset({Kind.CONTRASTIVE, Kind.BEAM, Kind.DIVERSE_BEAM})  # choosers with parameters of their own
SAMPLER = SeededSampler.method + ", after transformers warpers"


def _name(step: type) -> str:
    return f"{step.__module__}.{step.__name__}"


def plan_record(plan: Plan) -> dict[str, Any]:
    """The plan as result.json's `engine.plan` records it."""
    return {
        "path": plan.path.value,
        "kind": plan.kind.value,
        "step": None if plan.step is None else _name(plan.step),
        "cache": plan.cache.value,
        "prepared_mask": plan.mask,
        "refill": plan.refill,
        "warmup": plan.warmup,
        "rows_per_prompt": plan.rows_each,
        "decode_step": plan.decode_step.value,
        **({"samples": plan.samples} if plan.samples > 1 else {}),
    }


def generation_config(plan: Plan) -> dict[str, Any]:
    """The generation config as result.json records it, with what the engine adds."""
    out = plan.config.to_dict()
    if plan.kind in OWN_PARAMS and plan.step is not None:  # the strategy's parameters, as recorded before
        out["decodebench_loop"] = {"function": _name(plan.step), **plan.params}
    if plan.assistant is not None:
        out["decodebench_assistant"] = plan.assistant.info
    out["decodebench_decode"] = (
        "worker.engine.decode: own loop, finished rows dropped from the batch"  # as results have always said
        if plan.step is not None
        else "transformers generate()"
    )
    if plan.sampler is not None:
        out["decodebench_sampler"] = {"method": SAMPLER, **plan.sampler}
    return out


def _path_name(plan: Plan) -> str:
    """The path in the words result.json has always used."""
    if plan.step is None:
        return "transformers generate()"
    step = f"{CHOOSERS[plan.step]}; " if plan.step in CHOOSERS else ""
    refilled = ", free rows refilled" if plan.refill else ""
    return f"worker.engine.decode ({step}finished rows dropped{refilled})"


def _modifiers(plan: Plan) -> str | None:
    if not any_set(plan.config):  # no penalty and no minimum length set
        return None
    if plan.path is Path.DECODE:
        return "per row: each generation's own tokens and steps (worker.engine.modifiers)"
    return "transformers generate()"


def engine_record(lm: LoadedModel, plan: Plan, batches: BatchPlan, runtime, parts: list) -> dict[str, Any]:
    """What result.json's `engine` says about how the job ran (`parts`: the job's BatchOutputs)."""
    timings: list[BatchTiming] = [part.timing for part in parts]
    compactions = [t.compactions for t in timings if t.compactions is not None]
    energy = [t.energy_j for t in timings]
    cache = plan.config.cache_implementation or "dynamic"
    preallocated = bool(parts) and plan.cache is Cache.PREALLOCATED
    if preallocated:
        cache = "preallocated (worker.engine.kvcache: one buffer per batch, written in place)"
    return {
        "plan": plan_record(plan),
        "decode_loop": _path_name(plan),
        "batch_size": dict(batches.record),
        "dtype": lm.info["dtype"],
        "attention": lm.info.get("attention"),
        "kv_cache": cache,
        "compiled": cache == "static" and runtime.device.type == "cuda",
        "sampler": SAMPLER if plan.sampler is not None else None,
        "compactions": sum(compactions) if compactions else None,
        "refills": sum(t.refills for t in timings if t.refills is not None) if plan.refill else None,
        "energy": EnergyCounter.source if energy and all(e is not None for e in energy) else None,
        "modifiers": _modifiers(plan),
        "decode_mask": "prepared 4D boolean (no per-step rebuild)" if preallocated and plan.mask else None,
        "prompt_tokenisation": "once per job",
        "decode_step": decode_step_record(plan, timings),
    }


def decode_step_record(plan: Plan, timings: list[BatchTiming]) -> dict[str, Any]:
    """The decode step the plan took, why, and what its static steps did over the job's batches."""
    ran = [StepStats.parse(t.decode_step) for t in timings if t.decode_step is not None]
    total = StepStats()
    for stats in ran:
        total.add(stats)
    return {"mode": plan.decode_step.value, "why": plan.decode_step_why, **(total.record() if ran else {})}
