"""Running one job: the function RQ calls (`worker.job.run_job`) and local mode calls too.

`run_job(job_dict)` loads (or reuses) the model on the process's pinned device,
generates every prompt of the shard in batches, measures, and writes to the store:
generations.jsonl and log.jsonl first, result.json last (create-only), so a job is
complete exactly when its result.json exists and a retry never doubles a result.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import socket
import sys
from typing import Any

import structlog

import worker
from worker import paths
from worker.contract import GenerationRecord, JobResult, JobSpec, ModelSpec
from worker.logs import job_context
from worker.store import Store, jsonl_bytes, open_store

log = structlog.get_logger("decodebench.job")


class Runtime:
    """Per-process state: the pinned device and the model cache (created lazily)."""

    def __init__(self, device: str = "cpu") -> None:
        from worker.device import resolve_device
        from worker.models import ModelCache

        self.device = resolve_device(device)
        self.cache = ModelCache()
        from worker.device import device_info

        self.device_info = device_info(self.device)


_runtime: Runtime | None = None


def set_runtime(runtime: Runtime) -> None:
    global _runtime
    _runtime = runtime


def get_runtime() -> Runtime:
    """The process's runtime; default device from DECODEBENCH_DEVICE (cpu if unset)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(os.environ.get("DECODEBENCH_DEVICE", "cpu"))
    return _runtime


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def _provenance(job: JobSpec, runtime: Runtime, model_info: dict, scorer_info: dict | None) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "decodebench": worker.__version__,
        "host": socket.gethostname(),
        "image": os.environ.get("DECODEBENCH_IMAGE"),
        "pod": os.environ.get("POD_NAME"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": runtime.device_info,
        "model": model_info,
        "scorer": scorer_info,
        "seed": job.seed,
        "seeding": "each generation's seed = sha256(job seed, prompt id); see worker.engine",
    }


def execute(job: JobSpec, runtime: Runtime) -> tuple[JobResult, list[GenerationRecord]]:
    """Generate and measure one job; pure of the store."""
    import torch

    from worker import engine
    from worker.telemetry import Sampler

    started = _now()
    lm = runtime.cache.get(job.model, runtime.device)
    plan = engine.make_plan(lm, job.strategy, job.generation)
    bs = job.generation.batch_size
    notes: list[str] = []
    if plan.assistant_path is not None:
        plan.assistant = runtime.cache.get(ModelSpec(path=plan.assistant_path, dtype=job.model.dtype), runtime.device)
        if bs > 1:
            notes.append(f"assisted decoding runs one prompt at a time in transformers: batch_size {bs} -> 1")
            bs = 1
    batches = [job.prompts[i : i + bs] for i in range(0, len(job.prompts), bs)]
    seed_of = {p.id: engine.generation_seed(job.seed, p.id) for p in job.prompts}
    if job.generation.warmup:
        engine.warm_up(lm, plan, batches[0])
        if plan.assistant is not None:
            engine.warm_up(plan.assistant, plan, batches[0])
    if runtime.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runtime.device)
    records: list[GenerationRecord] = []
    timings = []
    outputs = []
    with Sampler(runtime.device) as sampler:
        for batch in batches:
            seeds = [seed_of[p.id] for p in batch]
            done = engine.generate_with_oom_retry(lm, plan, batch, seeds, notes)
            offset = 0
            for part in done:
                part_prompts = batch[offset : offset + part.timing.n]
                offset += part.timing.n
                timings.append(part.timing)
                outputs.append((part_prompts, part))
                log.info("batch.done", n=part.timing.n, new_tokens=part.timing.new_tokens,
                         total_s=round(part.timing.total_s, 4), prefill_s=round(part.timing.prefill_s, 4))
    torch_peak = torch.cuda.max_memory_allocated(runtime.device) / 2**20 if runtime.device.type == "cuda" else None

    scores: dict[str, tuple[float | None, int | None]] = {}
    scorer_info = None
    if not job.metrics or "perplexity" in job.metrics:
        scorer = runtime.cache.get(job.scorer, runtime.device) if job.scorer else lm
        scorer_info = scorer.info if job.scorer else None
        pairs, keys = [], []
        for prompts, part in outputs:
            for p, prompt_ids, gen_ids, text in zip(prompts, part.prompt_ids, part.token_ids, part.texts):
                if job.scorer:  # another tokenizer: score the text, context and continuation apart
                    prompt_ids = scorer.tokenizer(p.prompt)["input_ids"]
                    gen_ids = scorer.tokenizer(text, add_special_tokens=False)["input_ids"]
                pairs.append((prompt_ids, gen_ids))
                keys.append(p.id)
        scores = dict(zip(keys, engine.score_nll(scorer, pairs, bs)))

    for index, (prompts, part) in enumerate(outputs):
        for p, text, ids, reason in zip(prompts, part.texts, part.token_ids, part.stop_reasons):
            nll_sum, nll_count = scores.get(p.id, (None, None))
            records.append(GenerationRecord(
                job_id=job.job_id, cell=job.cell, model=job.model.label, strategy=job.strategy.name,
                params=job.strategy.params, seed=seed_of[p.id], job_seed=job.seed,
                prompt_id=p.id, prompt=p.prompt, reference=p.reference, text=text, token_ids=ids,
                n_new_tokens=len(ids), stop_reason=reason, batch=index, nll_sum=nll_sum, nll_count=nll_count,
            ))
    memory = {"torch_peak_mb": round(torch_peak, 2) if torch_peak is not None else None, **sampler.summary()}
    result = JobResult(
        job=job,
        started_at=started,
        finished_at=_now(),
        generation_config=plan.describe(),
        batches=timings,
        load_s=lm.info["load_s"],
        n_generations=len(records),
        new_tokens=sum(r.n_new_tokens for r in records),
        memory=memory,
        provenance=_provenance(job, runtime, lm.info, scorer_info),
        notes=notes,
    )
    return result, records


def run_job(job: dict, *, store: Store | None = None, runtime: Runtime | None = None) -> dict[str, Any]:
    """Run one job (a JobSpec as a JSON dict) and write it to the store. Idempotent."""
    spec = JobSpec.model_validate(job)
    store = store or open_store()
    runtime = runtime or get_runtime()
    t, s, j = spec.tenant, spec.sweep_id, spec.job_id
    with job_context(tenant=t, sweep_id=s, job_id=j, model=spec.model.label, strategy=spec.cell.split("::", 1)[1]) as lines:
        if store.job_complete(t, s, j):
            log.info("job.skipped", reason="already complete")
            return {"job_id": j, "status": "skipped"}
        log.info("job.start", prompts=len(spec.prompts), seed=spec.seed, device=str(runtime.device))
        try:
            result, records = execute(spec, runtime)
        except Exception as err:
            log.error("job.failed", error=f"{type(err).__name__}: {err}")
            store.write_jsonl(paths.log_key(t, s, j), lines)
            raise
        log.info("job.done", generations=result.n_generations, new_tokens=result.new_tokens,
                 generate_s=round(sum(b.total_s for b in result.batches), 3))
        generations = jsonl_bytes(r.model_dump() for r in records)
        result.generations_sha256 = hashlib.sha256(generations).hexdigest()
        store.write_bytes(paths.generations_key(t, s, j), generations)
        store.write_jsonl(paths.log_key(t, s, j), lines)
        created = store.write_json(paths.result_key(t, s, j), result.model_dump(mode="json"), create_only=True)
    return {"job_id": j, "status": "done" if created else "duplicate", "new_tokens": result.new_tokens}
