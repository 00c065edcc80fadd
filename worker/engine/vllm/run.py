"""One job on vLLM: `generate_job(job, runtime)`, the vLLM side of `worker.engine.job`'s dispatch seam.

The whole shard goes to `LLM.generate` at once (vLLM schedules its own continuous batch, up to
max_num_seqs), each prompt with its own `SamplingParams` carrying its own seed
(`worker.engine.sampling.generation_seed`, the same as the own engine's), so a generation does not
depend on which prompts it ran beside. Speed comes from vLLM's own request clocks: each request's
arrival, first token and last token give its latency, TTFT and TPOT in the own engine's columns.

A variant's `samples: n` is n requests a prompt, sample i seeded with the prompt's seed + i: the requests and
seeds of vLLM's `SamplingParams(n=n)`, whose child i is a request seeded seed + i
(vllm/v1/engine/parallel_sampling.py), each with its own request clock (`SamplingParams(n)` returns only its last
child's), so that every sample counts its own latency, TTFT and TPOT, as the own engine's do. Each record says its
`seed` and `sample`; sample 0 is the generation of the same job without samples. `best_of: model`
keeps a prompt's sample with the highest mean token log-probability, as the own engine does, from vLLM's
log-probabilities of the sampled tokens (`best_of: scorer` runs on the own engine only).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from typing import Any

import structlog

from worker.core.contract import JobSpec
from worker.core.engines import engine_refusal
from worker.core.errors import PermanentJobError
from worker.core.policy import context_refusal
from worker.core.results import BatchTiming, GenerationRecord, JobResult
from worker.engine import chat
from worker.engine.provenance import provenance
from worker.engine.samples import Generated, keep_best
from worker.engine.sampling import generation_seed
from worker.engine.telemetry import EnergyCounter, Sampler
from worker.engine.vllm.beam import beam_outputs
from worker.engine.vllm.llm import LLMCache, LoadedLLM, one_line
from worker.engine.vllm.logitsprocs import KINDS
from worker.engine.vllm.params import sampling_params, sampling_settings
from worker.engine.vllm.scoring import score_nll
from worker.engine.vllm.selfcheck import distribution_check

log = structlog.get_logger("decodebench.vllm")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def _cache(runtime) -> LLMCache:
    """The runtime's LLM cache, made on first use (the own engine's Runtime knows nothing of vLLM)."""
    if getattr(runtime, "vllm", None) is None:
        runtime.vllm = LLMCache()
    return runtime.vllm


def _stop_reason(completion) -> str:
    if completion.finish_reason == "length":
        return "length"
    return "stop_string" if isinstance(completion.stop_reason, str) else "eos"


def request_times(output, submitted: float, returned: float) -> tuple[float, float]:
    """(ttft_s, latency_s) of one request from vLLM's request metrics: arrival to first token and to
    last token. Where the installed vLLM reports none, the call's own clock (ttft = latency = the call)."""
    m = getattr(output, "metrics", None)
    arrival = getattr(m, "arrival_time", None)
    first = getattr(m, "first_token_ts", None) or getattr(m, "first_token_time", None)
    last = getattr(m, "last_token_ts", None) or getattr(m, "finished_time", None) or getattr(m, "last_token_time", None)
    latency_of_first = getattr(m, "first_token_latency", None)
    if latency_of_first is not None and first is not None and last is not None and last >= first:
        return latency_of_first, latency_of_first + (last - first)  # first/last on one clock, arrival on another
    if arrival is not None and first is not None and last is not None and last >= first >= arrival:
        return first - arrival, last - arrival
    return returned - submitted, returned - submitted


def _timing(outputs, submitted: float, returned: float, n_seqs: int, samples: int = 1) -> BatchTiming:
    """The batch of `outputs`, one request a generation (`samples` a prompt, in a row)."""
    ttft, latency, tpot = [], [], []
    for out in outputs:
        t, lat = request_times(out, submitted, returned)
        n = max(len(c.token_ids) for c in out.outputs)
        ttft.append(round(t, 6))
        latency.append(round(lat, 6))
        tpot.append(round((lat - t) / (n - 1), 6) if n > 1 else None)
    total = returned - submitted
    prefill = min(ttft, default=0.0)
    return BatchTiming(
        n=len(outputs) // samples,
        batch_size=n_seqs,
        input_tokens=sum(len(o.prompt_token_ids or []) for o in outputs[::samples]),  # a prompt's, once
        new_tokens=sum(len(c.token_ids) for o in outputs for c in o.outputs),
        prefill_s=prefill,
        total_s=total,
        decode_s=max(total - prefill, 0.0),
        steps=max((len(c.token_ids) for o in outputs for c in o.outputs), default=0),
        latency_s=latency,
        ttft_s=ttft,
        tpot_s=tpot,
    )


def _check_lengths(job: JobSpec, loaded: LoadedLLM, ids: list[list[int]]) -> None:
    longest = max((len(row) for row in ids), default=0)
    limit = loaded.llm.llm_engine.vllm_config.model_config.max_model_len
    why = context_refusal(limit, longest, job.generation.max_new_tokens, job.model.label)
    if why:
        raise PermanentJobError(f"engine vllm (max_model_len {limit}): {why}")


def _generation_eos(job: JobSpec) -> int | list[int] | None:
    """The EOS list of the model's generation config (None where it has none)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(job.model.path, revision=job.model.revision).eos_token_id
    except OSError:  # no generation_config.json
        return None


def _ends(job: JobSpec, tokenizer, settings_: dict) -> None:
    """A chat job's stop ids in its SamplingParams (every end of its turn, `chat.stop_ids`). LLM.beam_search ends
    only at the tokenizer's EOS: beam search is refused for a model whose generation ends elsewhere as well (a chat
    model's end of turn, a generation config's EOS list), where the own engine's beams end and vLLM's run on."""
    eos = _generation_eos(job)
    chats = chat.is_chat(tokenizer, job)
    stops = chat.stop_ids(tokenizer, eos) if chats else chat.end_ids(tokenizer, eos)
    if job.strategy.name != "beam":
        if chats:
            settings_["stop_token_ids"] = stops
    elif others := sorted(set(stops) - {tokenizer.eos_token_id}):
        where = "the template's end of turn" if chats else "the generation config's EOS ids"
        raise PermanentJobError(
            f"refused: beam on engine vllm for {'chat ' if chats else ''}model {job.model.label}: vLLM's beam search "
            f"ends only at the tokenizer's EOS, not at {where} {others}"
        )


def _caller(job: JobSpec, loaded: LoadedLLM, settings_: dict, seeds: list[int | None]):
    """The call that generates a list of prompts: LLM.generate with per-generation SamplingParams, or
    LLM.beam_search for beam."""
    if job.strategy.name == "beam":
        beams, length_penalty = settings_["beam_width"], settings_["length_penalty"]
        return lambda prompts, n: beam_outputs(loaded.llm, prompts, beams, settings_["max_tokens"], length_penalty)
    k = job.strategy.n_samples  # a prompt's samples: k requests, sample i seeded seed + i (the module's docstring)
    params = [sampling_params(settings_, None if seed is None else seed + i) for seed in seeds for i in range(k)]
    return lambda prompts, n: loaded.llm.generate(
        [p for p in prompts for _ in range(k)], params[: n * k], use_tqdm=False
    )


def _generate(job: JobSpec, loaded: LoadedLLM, call, device, ids):
    """The shard on vLLM by `call` (`_caller`), fed the token ids the own engine is fed (worker.engine.chat: raw
    text tokenised, or the chat template rendered once) as token-id prompts."""
    prompts = [{"prompt_token_ids": row} for row in ids]
    if job.generation.warmup:
        call(prompts[:1], 1)
    energy = EnergyCounter(device)
    with Sampler(device) as sampler:
        before = energy.read()
        submitted = time.perf_counter()
        outputs = call(prompts, len(prompts))
        returned = time.perf_counter()
        joules = energy.joules(before, energy.read())
    n_seqs = loaded.kwargs.get("max_num_seqs") or loaded.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
    timing = _timing(outputs, submitted, returned, min(n_seqs, len(prompts)), job.strategy.n_samples)
    timing.energy_j = None if joules is None else round(joules, 4)
    return outputs, timing, {"torch_peak_mb": None, **sampler.summary()}


def _run(job: JobSpec, runtime, loaded: LoadedLLM, settings_: dict, seeds: list[int | None], ids):
    """`_generate`, the LLM let go if vLLM fails inside it (its scheduler may still hold the failed requests:
    the next job gets a fresh LLM, never a wait on them). A failure on an LLM's first call is the model's:
    vLLM loaded it but cannot run it here (a head size its attention lacks), one permanent line naming it."""
    call = _caller(job, loaded, settings_, seeds)  # SamplingParams' own checks fail here, not as the model's
    try:
        out = _generate(job, loaded, call, runtime.device, ids)
    except Exception as err:
        _cache(runtime).close()
        if loaded.info.get("ran"):
            raise
        raise PermanentJobError(f"engine vllm cannot run model {job.model.label}: {one_line(err)}") from None
    loaded.info["ran"] = True
    return out


def _records(job: JobSpec, llm, outputs, seeds: list[int | None], ids: list[list[int]]) -> list[GenerationRecord]:
    """The job's records in the shard's order, a prompt's samples in sample order; a best_of variant keeps per
    prompt the sample with the highest mean token log-probability (vLLM's sampled-token log-probabilities of
    the raw model, `logprobs=0`), chosen as the own engine chooses (worker.engine.samples.keep_best). Scored
    (`nll_sum`, `nll_count`) under the generating model where the job asks for scores (worker.engine.vllm.scoring)."""
    items, nlls, k = [], [], job.strategy.n_samples
    for at, (p, seed, row) in enumerate(zip(job.prompts, seeds, ids, strict=True)):
        for sample, out in enumerate(outputs[at * k : (at + 1) * k]):  # sample i: the prompt's request i, seed + i
            completion = out.outputs[0]
            tokens = list(completion.token_ids)
            own_seed = seed + sample if seed is not None else generation_seed(job.seed, p.id)
            items.append(Generated(p, sample, own_seed, 0, row, tokens, completion.text, _stop_reason(completion)))
            total = getattr(completion, "cumulative_logprob", None)
            nlls.append((None, None) if total is None else (-total, len(tokens)))
    ranks = None
    if job.strategy.best_of is not None:
        kept = keep_best(items, nlls)
        items, ranks = [g for g, _, _ in kept], {g.prompt.id: scores for g, _, scores in kept}
    scored = "score" in job.compute and job.scorer is None  # a sweep's scorer: the own engine's (`_unscored`)
    nlls = score_nll(llm, [(g.prompt_ids, g.token_ids) for g in items]) if scored else [(None, None)] * len(items)
    return [
        g.record(job, ranks[g.prompt.id] if ranks is not None else None, nll_sum=nll[0], nll_count=nll[1])
        for g, nll in zip(items, nlls, strict=True)
    ]


def _unscored(job: JobSpec) -> list[str]:
    """The notes of what the job asks for that its vLLM worker cannot compute: a sweep scorer's scores, features."""
    notes = []
    if "score" in job.compute and job.scorer is not None:
        notes.append(
            "no scores (perplexity, coherence): the sweep's scorer is a transformers model, run by the own "
            "engine only; a vLLM cell is scored under its generating model only where the sweep has no scorer"
        )
    if "featurize" in job.compute and job.featurizer is not None:
        notes.append("no features (MAUVE): the featurizer is a transformers model, run by the own engine only")
    return notes


def _provenance(job: JobSpec, runtime, loaded: LoadedLLM) -> dict[str, Any]:
    """The one provenance (worker.engine.provenance) with vLLM's own entries."""
    import vllm

    own = {"engine": "vllm", "vllm": vllm.__version__}
    own["seeding"] = "each generation's seed = sha256(job seed, prompt id), passed as SamplingParams.seed"
    if job.strategy.samples is not None:
        own["sample_seeding"] = "sample i: a request of its own seeded seed + i, as SamplingParams(n) seeds child i"
    model = {"path": job.model.path, "revision": job.model.revision, "load_s": loaded.info["load_s"]}
    return provenance(job, runtime, {"model": model}, own)


def _engine_record(job: JobSpec, loaded: LoadedLLM, settings_: dict, timing: BatchTiming) -> dict[str, Any]:
    import vllm

    return {
        "name": "vllm",
        "label": job.engine.label or "vllm",
        "vllm": vllm.__version__,
        "llm": {k: v for k, v in loaded.kwargs.items() if k not in ("model", "tokenizer")},
        "settings": job.engine.model_dump(mode="json"),
        "kv_cache": loaded.info["kv_cache"],
        "kv_cache_space_gb": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
        "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
        "environment": loaded.info.get("env"),
        "sampling_params": settings_,
        "batch_size": {"requested": job.generation.batch_size, "used": timing.batch_size, "how": "vLLM's scheduler"},
        "timing": "vLLM request metrics: arrival, first token, last token per request",
        "energy": EnergyCounter.source if timing.energy_j is not None else None,
    }


def generate_job(job: JobSpec, runtime, *, check: bool = True) -> tuple[JobResult, list[GenerationRecord]]:
    """Generate and measure one job on vLLM; touches no store (as `worker.engine.job.generate_job`).
    `check`: run the report's distribution check where the job wants one (`selfcheck.wanted`); a caller
    that needs only the generations (a test of reproducibility) passes False."""
    started = _now()
    why = engine_refusal(job.engine, job.strategy.name, job.strategy.params, job.generation, job.strategy.best_of)
    if why:  # before vLLM starts: a pair it lacks is never run as something else
        raise PermanentJobError(why)
    loaded = _cache(runtime).get(job.model, job.engine, runtime.device.type, filters=job.strategy.name in KINDS)
    tokenizer = loaded.llm.get_tokenizer()
    ids = chat.prompt_ids(tokenizer, job)
    _check_lengths(job, loaded, ids)
    settings_ = sampling_settings(job.strategy, job.generation)
    _ends(job, tokenizer, settings_)  # a chat turn ends at the template's end of turn as well as at EOS
    stochastic = settings_["temperature"] > 0 and job.strategy.name != "beam"
    seeds = [generation_seed(job.seed, p.id) if stochastic else None for p in job.prompts]
    outputs, timing, memory = _run(job, runtime, loaded, settings_, seeds, ids)
    records = _records(job, loaded.llm, outputs, seeds, ids)
    notes = _unscored(job)
    if job.generation.batch_size != "auto" and job.generation.batch_size != timing.batch_size:
        notes.append(f"vllm schedules its own batch: the shard's {len(job.prompts)} prompts at once")
    if job.strategy.best_of is not None:
        notes.append(
            f"best_of: {job.strategy.n_samples} samples a prompt generated (all in the batch's timing), the one with "
            "the highest mean token log-probability under the model (vLLM's raw log-probabilities) kept"
        )
    result = JobResult(
        job=job,
        started_at=started,
        finished_at=_now(),
        generation_config={"engine": "vllm", **settings_, "seeds": "per generation (generations.jsonl `seed`)"},
        batches=[timing],
        load_s=loaded.info["load_s"],
        n_generations=len(records),
        new_tokens=sum(r.n_new_tokens for r in records),
        memory=memory,
        provenance=_provenance(job, runtime, loaded),
        notes=notes,
        engine=_engine_record(job, loaded, settings_, timing),
    )
    if (rendered := chat.chat_record(tokenizer, job, {p.id: row for p, row in zip(job.prompts, ids)})) is not None:
        result.engine["chat"] = rendered
    checked = distribution_check(job, loaded.llm, settings_, ids[0]) if check else None  # after the timing
    result.engine["distribution_check"] = checked
    return result, records
