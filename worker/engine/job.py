"""Running one job: what local mode and the RQ worker both call (`run_job`).

`run_job(spec, store=..., runtime=...)` loads (or reuses) the model on the runtime's
pinned device, plans the job once (`plan_job`: worker.engine.plan's choices with the prompts
tokenised once, the warm-up on the plan's path, then the batch plan beside it), generates
every prompt of the shard in batches (`generate_job`), measures, and writes to the store:
generations.jsonl and log.jsonl first, result.json last (create-only), so a job is complete
exactly when its result.json exists and a retry never doubles a result.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import hashlib
import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from worker.core import paths, settings
from worker.core.contract import JobSpec, ModelSpec
from worker.core.errors import DecodebenchError, PermanentJobError
from worker.core.logs import job_context
from worker.core.policy import context_refusal, model_positions
from worker.core.results import GenerationRecord, JobResult
from worker.engine import chat, samples
from worker.engine import generate as gen
from worker.engine.batching import AutoBatch, auto_groups, buckets, cut
from worker.engine.device import device_info, resolve_device
from worker.engine.features import featurize
from worker.engine.models import LoadedModel, ModelCache, quiet_transformers
from worker.engine.plan import BatchPlan, Plan, configure
from worker.engine.provenance import provenance
from worker.engine.record import engine_record, generation_config
from worker.engine.samples import Generated, keep_best
from worker.engine.scoring import retokenised, same_tokenizer, score_nll
from worker.engine.telemetry import EnergyCounter, Sampler
from worker.store import Store, jsonl_bytes
from worker.strategies import Kind, get_strategy, variant_label

log = structlog.get_logger("decodebench.job")


@dataclass(frozen=True)
class EngineSettings:
    """What the engine takes from the settings table, and the pod's names, given once where the process
    starts (the worker's command line, `decodebench run`: `from_environment`); defaults are the table's."""

    model_cache_size: int = settings.SETTINGS["model_cache_size"].default
    model_cache_mb: int | None = settings.SETTINGS["model_cache_mb"].default
    auto_batch_max: int = settings.SETTINGS["auto_batch_max"].default
    sdpa_cudnn: bool = settings.SETTINGS["sdpa_cudnn"].default
    image: str | None = None  # recorded in every result's provenance
    pod: str | None = None  # the pod and node names the chart gives the worker (Kubernetes' downward API)
    node: str | None = None

    @classmethod
    def from_environment(cls) -> EngineSettings:
        """The settings as the table resolves them (DECODEBENCH_*, POD_NAME and NODE_NAME, or defaults)."""
        return cls(
            model_cache_size=settings.get("model_cache_size"),
            model_cache_mb=settings.get("model_cache_mb"),
            auto_batch_max=settings.get("auto_batch_max"),
            sdpa_cudnn=settings.get("sdpa_cudnn"),
            image=settings.get("image"),
            pod=settings.get("pod"),
            node=settings.get("node"),
        )


class Runtime:
    """A process's pinned device, its settings and its model cache; created once by whoever runs jobs."""

    def __init__(self, device: str = "cpu", engine: EngineSettings | None = None) -> None:
        quiet_transformers()
        self.settings = engine or EngineSettings()
        self.device = resolve_device(device)
        budget_mb = self.settings.model_cache_mb
        self.cache = ModelCache(self.settings.model_cache_size, budget_mb * 2**20 if budget_mb else None)
        self.device_info = device_info(self.device)
        if self.device.type == "cuda":  # process-wide, like the device: a worker process is pinned to one
            torch.backends.cuda.enable_cudnn_sdp(self.settings.sdpa_cudnn)
            self.device_info["sdpa_cudnn"] = torch.backends.cuda.cudnn_sdp_enabled()
        self.batch_sizes = AutoBatch()  # batch_size: auto, probed once per model x device x lengths


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def _runs(groups, refill: bool) -> list[tuple[list, int | None]]:
    """What the device runs, in order: (prompts, stream slots or None for a batch). With continuous
    refill each group of more than one batch is one stream of its batch size's rows."""
    runs = []
    for size, batches in groups:
        if refill and len(batches) > 1:
            runs.append(([p for batch in batches for p in batch], size))
        else:
            runs.extend((list(batch), None) for batch in batches)
    return runs


def _generate(runtime: Runtime, lm: LoadedModel, plan: Plan, batches: BatchPlan, seeds_of, notes):
    """Every batch (or stream) of the job, measured: [(prompts, BatchOutput)] and the memory readings.

    A batch's host half (copying tokens out, detokenising, cutting at stop strings,
    measuring) runs on a finisher thread while the device runs the next batch, so the
    device does not wait for text. The finisher runs in the job's logging context.
    """
    if runtime.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runtime.device)
    energy = EnergyCounter(runtime.device)
    pending, door = [], _Door()
    try:
        with Sampler(runtime.device) as sampler, ThreadPoolExecutor(1, thread_name_prefix="decodebench-finish") as pool:
            for batch, slots in _runs(batches.groups, plan.refill):
                before = energy.read()
                seeds = [seed for p in batch for seed in seeds_of[p.id]]  # a prompt's samples one after another
                raws = gen.run_with_oom_retry(lm, plan, batch, seeds, notes, slots)
                joules = energy.joules(before, energy.read())
                context = contextvars.copy_context()
                pending.append((batch, joules, [pool.submit(door.run, context, lm, plan, raw) for raw in raws]))
            outputs = [out for batch, joules, parts in pending for out in _split(batch, joules, parts)]
    finally:
        door.close()
    torch_peak = torch.cuda.max_memory_allocated(runtime.device) / 2**20 if runtime.device.type == "cuda" else None
    memory = {"torch_peak_mb": round(torch_peak, 2) if torch_peak is not None else None, **sampler.summary()}
    return outputs, memory


class _Door:
    """The finisher's way in. Ctrl-C may land anywhere in the job, even while the pool starts its thread
    (the pool then neither knows that thread nor waits for it), so the pool's own shutdown cannot promise
    that no batch is finished after the job gave up. `close` waits for a batch being finished and turns the
    rest away: nothing is finished, or logged, after the job has returned or raised."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = True

    def run(self, context: contextvars.Context, lm: LoadedModel, plan: Plan, raw: gen.RawBatch) -> gen.BatchOutput:
        with self._lock:
            if not self._open:
                raise CancelledError("the job gave up before this batch was finished")
            return context.run(_finish, lm, plan, raw)

    def close(self) -> None:
        with self._lock:
            self._open = False


def _finish(lm: LoadedModel, plan: Plan, raw: gen.RawBatch) -> gen.BatchOutput:
    part = gen.finish_batch(lm.tokenizer, plan, raw)
    t = part.timing
    log.info("batch.done", n=t.n, new_tokens=t.new_tokens, total_s=round(t.total_s, 4), prefill_s=round(t.prefill_s, 4))
    return part


def _split(batch, joules: float | None, futures) -> list[tuple[list, gen.BatchOutput]]:
    """A batch's finished parts with their prompts; an OOM-split batch shares its energy by tokens."""
    parts = [f.result() for f in futures]
    tokens = sum(part.timing.new_tokens for part in parts)
    out, offset = [], 0
    for part in parts:
        if joules is not None:
            part.timing.energy_j = round(joules * part.timing.new_tokens / max(tokens, 1), 4)
        out.append((batch[offset : offset + part.timing.n], part))
        offset += part.timing.n
    return out


def _nlls(job: JobSpec, runtime: Runtime, lm: LoadedModel, items: list[Generated], batch_size: int, scorer_spec):
    """Each generation's (nll_sum, nll_count) under `scorer_spec` (None: the generating model), and the scorer's
    info: the stored token ids when the scorer shares the generating model's tokenizer, else the re-tokenised
    text (worker.engine.scoring)."""
    scorer = runtime.cache.get(scorer_spec, runtime.device) if scorer_spec else lm
    stored = same_tokenizer(scorer.tokenizer, lm.tokenizer, [p.prompt for p in job.prompts])
    pairs = [
        (g.prompt_ids, g.token_ids) if stored else retokenised(scorer, g.prompt.prompt, g.text, g.stop_reason)
        for g in items
    ]
    info = {**scorer.info, "scored": "generated token ids" if stored else "re-tokenised text"} if scorer_spec else None
    return score_nll(scorer, pairs, batch_size), info


def _best_of(job: JobSpec, runtime: Runtime, lm: LoadedModel, items: list[Generated], batch_size: int):
    """best_of: per prompt, the sample with the highest mean log-probability (worker.engine.samples) under the
    generating model or the scorer: the kept generations, each one's NLL and its prompt's sample scores."""
    by = job.scorer if job.strategy.best_of == "scorer" else None
    nlls, _ = _nlls(job, runtime, lm, items, batch_size, by)
    kept = keep_best(items, nlls)
    reuse = "score" in job.compute and by == job.scorer  # the metrics' scorer is the one that ranked them
    scores = {(g.prompt.id, g.sample): nll for g, nll, _ in kept} if reuse else None
    return [g for g, _, _ in kept], {g.prompt.id: ranks for g, _, ranks in kept}, scores


def _score(job: JobSpec, runtime: Runtime, lm: LoadedModel, items: list[Generated], batch_size: int, known=None):
    """(prompt id, sample) -> (nll_sum, nll_count) under the sweep's scorer (or the generating model), and the
    scorer's info; `known`: scores best_of already computed under that scorer."""
    if "score" not in job.compute:
        return {}, None
    nlls, info = _nlls(job, runtime, lm, [] if known is not None else items, batch_size, job.scorer)
    return known if known is not None else {(g.prompt.id, g.sample): nll for g, nll in zip(items, nlls)}, info


def _features(job: JobSpec, runtime: Runtime, items: list[Generated], batch_size: int):
    """(prompt id, sample) -> (features of prompt + text, of prompt + reference or None), and the featurizer's
    info."""
    if job.featurizer is None or "featurize" not in job.compute:
        return {}, None
    featurizer = runtime.cache.get(job.featurizer, runtime.device)
    refs = list({g.prompt.id: g.prompt for g in items if g.prompt.reference is not None}.values())
    feats = featurize(featurizer, [g.prompt.prompt + g.text for g in items], job.featurizer_max_tokens, batch_size)
    ref_feats = featurize(featurizer, [p.prompt + p.reference for p in refs], job.featurizer_max_tokens, batch_size)
    by_ref = {p.id: f for p, f in zip(refs, ref_feats)}
    info = {**featurizer.info, "max_tokens": job.featurizer_max_tokens, "feature": "final hidden state, last token"}
    return {(g.prompt.id, g.sample): (f, by_ref.get(g.prompt.id)) for g, f in zip(items, feats)}, info


def plan_job(job: JobSpec, runtime: Runtime, lm: LoadedModel) -> tuple[Plan, BatchPlan]:
    """The job's plan, decided once from everything it needs (worker.engine.plan.configure: the strategy, the
    settings, the shard tokenised once, the assistant model where the strategy has one), the warm-up on its
    path run before any probe (so that a probe times warm kernels), then the batch plan beside it."""
    assistant = job.strategy.params.get("assistant") if get_strategy(job.strategy.name).kind is Kind.ASSISTED else None
    draft = runtime.cache.get(ModelSpec(path=assistant, dtype=job.model.dtype), runtime.device) if assistant else None
    prompts = chat.encoded(lm.tokenizer, job)  # raw text, or the chat template rendered once
    plan = configure(lm, job.strategy, job.generation, prompts, draft)
    lengths = [len(prompts.ids[p.id]) for p in job.prompts]
    for m in (lm, draft) if draft is not None else (lm,):  # before any allocation: no position past the end
        why = context_refusal(
            model_positions(m.model.config.to_dict()),
            max(lengths, default=0),
            job.generation.max_new_tokens,
            m.spec.label,
        )
        if why:
            raise PermanentJobError(why)
    if plan.warmup:
        gen.warm_up(lm, plan, job.prompts[:1])
    return plan, plan_batches(job, runtime, lm, plan, lengths)


def plan_batches(job: JobSpec, runtime: Runtime, lm: LoadedModel, plan: Plan, lengths: list[int]) -> BatchPlan:
    """The batch size (fixed or auto) and the length-bucketed batches: groups of (size, batches), longest
    prompts first (several groups only where auto sizes length buckets apart); the size of the first (the
    longest prompts', which the scorer's batches use) and their record."""
    requested = job.generation.batch_size
    info: dict[str, Any] = {"requested": requested}
    if plan.assistant is not None:
        groups, info["used"] = [(1, buckets(lengths, 1))], 1
    elif requested == "auto":
        sized, more = auto_groups(runtime, lm, plan, job, lengths)
        groups = [(size, cut(ix, size)) for size, ix in sized]
        info.update(more)
    else:
        groups, info["used"] = [(requested, buckets(lengths, requested))], requested
    info["bucketing"] = "prompts sorted by token length (longest first); generations in the shard's order"
    planned = tuple(
        (size, tuple(tuple(job.prompts[i] for i in batch) for batch in batches)) for size, batches in groups
    )
    return BatchPlan(groups=planned, scorer_size=groups[0][0], record=info)


def _records(job: JobSpec, items: list[Generated], scores: dict, features: dict, ranks: dict | None):
    """The job's generation records, with their scores and features (and best_of's sample scores), in the
    shard's order, a prompt's samples in sample order."""
    records = []
    for g in items:
        nll_sum, nll_count = scores.get((g.prompt.id, g.sample), (None, None))
        feats, ref_feats = features.get((g.prompt.id, g.sample), (None, None))
        best_of = ranks[g.prompt.id] if ranks is not None else None
        records.append(
            g.record(job, best_of, nll_sum=nll_sum, nll_count=nll_count, features=feats, reference_features=ref_feats)
        )
    position = {p.id: i for i, p in enumerate(job.prompts)}
    records.sort(key=lambda r: (position[r.prompt_id], r.sample))  # the shard's order, whatever the buckets
    return records


def _models_info(lm: LoadedModel, plan: Plan, scorer_info, featurizer_info) -> dict[str, Any]:
    """The provenance's models: the generating model, the scorer and the featurizer (None where the job has none),
    and an assisted strategy's draft where it has one."""
    info = {"model": lm.info, "scorer": scorer_info, "featurizer": featurizer_info}
    return info | ({"assistant": plan.assistant.info} if plan.assistant is not None else {})


def generate_job(job: JobSpec, runtime: Runtime) -> tuple[JobResult, list[GenerationRecord]]:
    """Generate and measure one job; touches no store."""
    started = _now()
    lm = runtime.cache.get(job.model, runtime.device)
    plan, batches = plan_job(job, runtime, lm)
    notes: list[str] = list(plan.notes)
    if plan.assistant is not None and job.generation.batch_size != 1:
        notes.append(
            f"assisted decoding runs one prompt at a time in transformers: batch_size {job.generation.batch_size} -> 1"
        )
    seeds_of = samples.seeds(job)
    outputs, memory = _generate(runtime, lm, plan, batches, seeds_of, notes)
    bs = batches.scorer_size
    items, ranks, known = samples.generations(outputs, seeds_of), None, None
    if job.strategy.best_of is not None:
        items, ranks, known = _best_of(job, runtime, lm, items, bs)
        notes.append(
            f"best_of: {job.strategy.n_samples} samples a prompt generated (all in the batches' timings), the one with "
            f"the highest mean token log-probability under the {job.strategy.best_of} kept"
        )
    scores, scorer_info = _score(job, runtime, lm, items, bs, known)
    features, featurizer_info = _features(job, runtime, items, bs)
    records = _records(job, items, scores, features, ranks)
    result = JobResult(
        job=job,
        started_at=started,
        finished_at=_now(),
        generation_config=generation_config(plan),
        batches=[part.timing for _, part in outputs],
        load_s=lm.info["load_s"],
        n_generations=len(records),
        new_tokens=sum(r.n_new_tokens for r in records),
        memory=memory,
        provenance=provenance(job, runtime, _models_info(lm, plan, scorer_info, featurizer_info)),
        notes=notes,
        engine=engine_record(lm, plan, batches, runtime, [part for _, part in outputs]),
    )
    if (rendered := chat.chat_record(lm.tokenizer, job, plan.prompt_ids)) is not None:
        result.engine["chat"] = rendered
    return result, records


def engine_generate(spec: JobSpec, runtime: Runtime) -> tuple[JobResult, list[GenerationRecord]]:
    """The one seam where a job picks its engine (worker.core.engines): vLLM's, or the own one."""
    if spec.engine is not None and spec.engine.name == "vllm":
        from worker.engine.vllm.run import generate_job as vllm_generate_job

        return vllm_generate_job(spec, runtime)
    return generate_job(spec, runtime)


def run_job(spec: JobSpec, *, store: Store, runtime: Runtime) -> dict[str, Any]:
    """Run one job and write it to the store. Idempotent: a complete job is skipped."""
    t, s, j = spec.tenant, spec.sweep_id, spec.job_id
    strategy = variant_label(spec.strategy.name, spec.strategy.params)
    with job_context(tenant=t, sweep_id=s, job_id=j, model=spec.model.label, strategy=strategy) as lines:
        if store.job_complete(t, s, j):
            log.info("job.skipped", reason="already complete")
            return {"job_id": j, "status": "skipped"}
        log.info("job.start", prompts=len(spec.prompts), seed=spec.seed, device=str(runtime.device))
        try:
            result, records = engine_generate(spec, runtime)
        except Exception as err:
            log.error("job.failed", error=f"{type(err).__name__}: {err}")
            if not isinstance(err, DecodebenchError):  # a crash (a plugin's step, a bug): where, in the job's log
                log.info("job.traceback", exc_info=err)
            store.write_jsonl(paths.log_key(t, s, j), lines)
            raise
        log.info(
            "job.done",
            generations=result.n_generations,
            new_tokens=result.new_tokens,
            generate_s=round(sum(b.total_s for b in result.batches), 3),
        )
        generations = jsonl_bytes(r.model_dump() for r in records)
        result.generations_sha256 = hashlib.sha256(generations).hexdigest()
        store.write_bytes(paths.generations_key(t, s, j), generations)
        store.write_jsonl(paths.log_key(t, s, j), lines)
        created = store.write_json(paths.result_key(t, s, j), result.model_dump(mode="json"), create_only=True)
    return {"job_id": j, "status": "done" if created else "duplicate", "new_tokens": result.new_tokens}
