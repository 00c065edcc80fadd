"""What result.json says about how a job ran: its `engine` (every choice that makes cells comparable) and
its `provenance` (versions, host, device, models, seeding).

`engine_record(lm, plan, runtime, parts)` writes down the plan as it is (worker.engine.plan: path,
step, cache, prepared mask, refill, warm-up, rows per prompt) and, in the words results have always
used, the decoding loop, the batch size (fixed or auto, and what was probed), dtype, attention
kernels, KV cache, compilation, sampler, compactions, refills, energy source and modifiers.
"""

from __future__ import annotations

import platform
import socket
import sys
from typing import Any

import torch

import worker
from worker.core.contract import JobSpec
from worker.core.results import BatchTiming
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


def provenance(
    job: JobSpec, runtime: Any, model_info: dict, scorer_info: dict | None, featurizer_info: dict | None
) -> dict[str, Any]:
    """result.json's provenance: versions, host, pod, device, the models' info, how seeds were derived.
    `runtime`: the worker's (worker.engine.job.Runtime: its settings and device info)."""
    import transformers

    return {
        "decodebench": worker.__version__,
        "host": socket.gethostname(),
        "image": runtime.settings.image,
        "pod": runtime.settings.pod,
        "node": runtime.settings.node,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": runtime.device_info,
        "model": model_info,
        "scorer": scorer_info,
        "featurizer": featurizer_info,
        "seed": job.seed,
        "seeding": "each generation's seed = sha256(job seed, prompt id); see worker.engine.sampling",
        **_samples_provenance(job),
    }


def _samples_provenance(job: JobSpec) -> dict[str, Any]:
    """What result.json's provenance says of a variant with samples (nothing for one without)."""
    if job.strategy.samples is None:
        return {}
    return {
        "samples": job.strategy.samples,
        "best_of": job.strategy.best_of,
        "sample_seeding": "sample 0: the generation's seed; sample i >= 1: sha256 of JSON [job seed, prompt id, i]",
    }
