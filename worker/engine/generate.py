"""Generating one batch: a strategy's settings, one timed generate() call, the rows' texts.

`configure_decoding(model, strategy, settings)` turns a strategy variant into a
`Decoding` (a transformers GenerationConfig plus what the engine adds: the seeded
sampler's settings, a strategy's own loop, an assistant model). `generate_batch` runs one
left-padded batch with it, timed by `worker.engine.timing.StepClock`; sampling is
seeded per generation (`worker.engine.sampling`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from worker.core.contract import BatchTiming, GenerationSettings, PromptItem, StrategySpec
from worker.engine import decode as own_loop
from worker.engine.kvcache import preallocated_cache, reorderable
from worker.engine.loops import beam as beam_loop
from worker.engine.loops import contrastive
from worker.engine.loops.beam_step import BeamStep
from worker.engine.models import LoadedModel
from worker.engine.modifiers import RowModifiers, build_modifiers, only_modifiers
from worker.engine.sampling import SAMPLING_KEYS, SeededSampler, build_warpers
from worker.engine.stops import FinishRecorder, StopStrings
from worker.engine.timing import StepClock, StepTimes, synchronize
from worker.strategies import get_strategy

log = structlog.get_logger("decodebench.engine")


@dataclass
class Decoding:
    """How one job calls generate() (or a strategy's own loop): the config and the sampling set-up."""

    config: GenerationConfig
    warpers_cfg: dict[str, Any] | None  # sampling settings applied by the engine, or None
    stop: list[str]
    loop: str | None = None  # "module:function" of a strategy's own decoding loop
    loop_params: dict[str, Any] | None = None
    assistant_path: str | None = None  # assisted decoding: the draft model to load
    assistant: LoadedModel | None = None
    own_loop: bool = False  # through worker.engine.decode (compaction, refill) instead of generate() or `loop`
    step: Any = None  # the own loop's step where it is not greedy/sampling's (contrastive.Step)
    refill: bool = False  # the own loop with continuous refill
    prompt_ids: dict[str, list[int]] | None = None  # the job's prompts tokenised once, by prompt id
    notes: list[str] = field(default_factory=list)  # what the result's notes should say about the set-up

    def describe(self) -> dict[str, Any]:
        out = self.config.to_dict()
        if self.loop is not None:
            out["decodebench_loop"] = {"function": self.loop, **(self.loop_params or {})}
        if self.assistant is not None:
            out["decodebench_assistant"] = self.assistant.info
        out["decodebench_decode"] = (
            "worker.engine.decode: own loop, finished rows dropped from the batch"
            if self.own_loop
            else "transformers generate()"
        )
        if self.warpers_cfg is not None:
            out["decodebench_sampler"] = {
                "method": SeededSampler.method + ", after transformers warpers",
                **{k: v for k, v in self.warpers_cfg.items() if not k.startswith("_")},
            }
        return out


def configure_decoding(lm: LoadedModel, strategy: StrategySpec, settings: GenerationSettings) -> Decoding:
    """The Decoding of a strategy variant on a loaded model (its tokenizer's pad and EOS)."""
    registered = get_strategy(strategy.name)
    kwargs = registered.generation_kwargs(strategy.params)
    tok = lm.tokenizer
    base = lm.model.generation_config.to_dict()
    cfg = GenerationConfig(**{**base, **kwargs})
    cfg.max_new_tokens = settings.max_new_tokens
    cfg.min_new_tokens = settings.min_new_tokens or None
    cfg.max_length = None
    cfg.pad_token_id = tok.pad_token_id
    if cfg.eos_token_id is None:
        cfg.eos_token_id = tok.eos_token_id
    warpers_cfg = None
    if cfg.do_sample and cfg.num_beams == 1:
        warpers_cfg = {k: getattr(cfg, k) for k in SAMPLING_KEYS}
        warpers_cfg["_device"] = lm.device
        cfg.do_sample = False
        cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p, cfg.typical_p = 1.0, None, 1.0, None, 1.0
        cfg.epsilon_cutoff, cfg.eta_cutoff = 0.0, 0.0
    if (cfg.num_beams > 1 or "assistant" in strategy.params) and settings.stop:
        cfg.stop_strings = list(settings.stop)
    params = registered.validate(strategy.params)
    loop_params = params if registered.loop else None
    decoding = Decoding(cfg, warpers_cfg, list(settings.stop), registered.loop, loop_params, params.get("assistant"))
    if settings.static_cache:
        if getattr(lm.model, "_can_compile_fullgraph", False) and registered.loop is None:
            cfg.cache_implementation = "static"  # generate() compiles the forward pass on CUDA for it
        else:
            decoding.notes.append("static_cache: not supported for this model or strategy; dynamic cache used")
    decoding.own_loop = own_loop.supports(cfg, registered.loop, decoding.assistant_path)
    if (
        registered.loop is None
        and decoding.assistant_path is None
        and beam_loop.supports(cfg)
        and reorderable(lm.model)
    ):
        # beam search in the engine's beam loop, where prompts that are done leave the forward pass
        decoding.loop, decoding.loop_params = beam_loop.LOOP, beam_loop.beam_params(cfg)
    decoding.step = _own_step(lm, decoding)
    decoding.own_loop = decoding.own_loop or decoding.step is not None
    if decoding.own_loop or decoding.loop is not None:  # the own loop and contrastive search's use the mask
        own_loop.prepared_mask(lm.model)  # its once-per-model check runs here, outside any timed batch
    # refill needs the preallocated cache (plain full-attention layers); penalties apply row by row
    decoding.refill = decoding.own_loop and settings.refill and preallocated_cache(lm.model, 1) is not None
    return decoding


def _own_step(lm: LoadedModel, decoding: Decoding):
    """The own loop's step for a strategy loop that has one, where it applies: contrastive search where
    its candidates share their row's cache; beam search (and diverse) with the preallocated cache."""
    if decoding.loop == contrastive.LOOP and contrastive.runs_in_own_loop(lm.model, decoding.config):
        return contrastive.Step
    if (
        decoding.loop == beam_loop.LOOP
        and only_modifiers(decoding.config)
        and preallocated_cache(lm.model, 1) is not None
    ):
        return BeamStep
    return None


def _import(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass
class BatchOutput:
    texts: list[str]
    token_ids: list[list[int]]
    stop_reasons: list[str]
    prompt_ids: list[list[int]]
    timing: BatchTiming
    kv_cache: str | None = None  # the own loop's KV cache ("preallocated" or "dynamic"); None: generate()'s


def eos_ids(cfg: GenerationConfig) -> list[int]:
    eos = cfg.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def _run(lm: LoadedModel, decoding: Decoding, enc, processors, criteria):
    """The generate() call, or the strategy's own loop, on one encoded batch."""
    if decoding.loop is not None:
        processors.extend(build_modifiers(decoding.config, enc["input_ids"].shape[1], enc["attention_mask"]))
        loop = _import(decoding.loop)
        return loop(lm.model, enc, decoding.config, decoding.loop_params, processors, criteria, check_every(lm.device))
    with torch.inference_mode():
        return lm.model.generate(
            **enc,
            generation_config=decoding.config,
            logits_processor=processors,
            stopping_criteria=criteria,
            tokenizer=lm.tokenizer if decoding.config.stop_strings else None,
            assistant_model=decoding.assistant.model if decoding.assistant is not None else None,
        )


def _finish(tok, decoding: Decoding, new: list[list[int]], recorder: FinishRecorder | None):
    """Each row cut at its end (EOS, stop string or length): (texts, token ids, stop reasons)."""
    eos = set(eos_ids(decoding.config))
    texts, ids, reasons = [], [], []
    for row, seq in enumerate(new):
        if recorder is not None and recorder.finished[row] is not None:
            n, reason = recorder.finished[row]
        else:
            first_eos = next((i for i, t in enumerate(seq) if t in eos), None)
            n, reason = (first_eos + 1, "eos") if first_eos is not None else (len(seq), "length")
        seq = seq[:n]
        text = tok.decode(seq, skip_special_tokens=True)
        cut = min((text.find(s) for s in decoding.stop if s in text), default=-1)
        if cut >= 0:
            text, reason = text[:cut], "stop_string"
            if recorder is None and seq and seq[-1] in eos:  # generate() padded after the stop string: not a token
                seq = seq[:-1]
        texts.append(text)
        ids.append(seq)
        reasons.append(reason)
    return texts, ids, reasons


def encode(lm: LoadedModel, decoding: Decoding, prompts: list[PromptItem]) -> dict[str, torch.Tensor]:
    """The left-padded batch, from the shard's token ids when the job tokenised them once."""
    return {k: v.to(lm.device) for k, v in _encode_host(lm, decoding, prompts).items()}


def _encode_host(lm: LoadedModel, decoding: Decoding, prompts: list[PromptItem]) -> dict[str, torch.Tensor]:
    tok = lm.tokenizer
    known = decoding.prompt_ids
    if known is None or any(p.id not in known for p in prompts):
        enc = tok([p.prompt for p in prompts], return_tensors="pt", padding=True)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    rows = [known[p.id] for p in prompts]
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask}


def _refill(lm: LoadedModel, decoding: Decoding, prompts: list[PromptItem], slots: int) -> own_loop.Refill:
    """The job's prompts after the first `slots` as a queue the loop draws free rows from."""
    cursor = [slots]

    def next_rows(k: int):
        start = cursor[0]
        if start >= len(prompts) or k <= 0:
            return None
        batch = prompts[start : start + k]
        cursor[0] = start + len(batch)
        return encode(lm, decoding, batch), start

    return own_loop.Refill(next_rows, total=len(prompts), slots=slots, longest=_longest(lm, decoding, prompts))


def _longest(lm: LoadedModel, decoding: Decoding, prompts: list[PromptItem]) -> int:
    """The longest of the prompts in tokens: the width of their left-padded batch."""
    return _encode_host(lm, decoding, prompts)["input_ids"].shape[1]


def check_every(device) -> int:
    """Steps between the own loop's looks for finished rows: every step on the CPU, where a look
    costs nothing; every 8 on CUDA, where it is a host synchronisation."""
    return 1 if device.type == "cpu" else 8


def _decode_own(lm: LoadedModel, decoding: Decoding, enc, clock, seeds: list[int], refill=None):
    """The compacting loop (worker.engine.decode): its output and a finish recorder of its rows' ends."""
    cfg, device = decoding.config, lm.device
    prompt_len = enc["input_ids"].shape[1]
    sampler = warpers = None
    if decoding.warpers_cfg is not None:
        warpers = LogitsProcessorList(build_warpers(decoding.warpers_cfg))
        sampler = SeededSampler(seeds, device, max_steps=cfg.max_new_tokens)
    stop = StopStrings(lm.tokenizer, decoding.stop) if decoding.stop else None
    out = own_loop.decode(
        lm.model,
        enc,
        cfg,
        clock=clock,
        processors=RowModifiers(cfg),
        warpers=warpers,
        sampler=sampler,
        stop=stop,
        eos=eos_ids(cfg),
        check_every=check_every(device),
        refill=refill,
        step=decoding.step,
        step_params=decoding.step.params(decoding.loop_params) if decoding.step is not None else None,
    )
    recorder = FinishRecorder(prompt_len, [], None, len(seeds), "cpu")
    for row, (n, at_eos) in enumerate(zip(out.finished.n_new, out.finished.at_eos)):
        if n > 0:
            recorder.finished[row] = (n, "eos" if at_eos else "stop_string")
    return out, recorder


@dataclass
class RawBatch:
    """A batch as the device left it: its new tokens and prompts on the CPU, not yet texts."""

    n: int
    input_ids: torch.Tensor  # (rows, prompt width), CPU
    attention_mask: torch.Tensor
    new: torch.Tensor  # (rows, steps), CPU
    recorder: FinishRecorder | None
    times: StepTimes
    steps: int
    compactions: int | None
    kv_cache: str | None
    refills: int | None = None  # a stream's admissions of new rows (None: a plain batch)
    slots: int | None = None  # a stream's rows decoding at once
    latency_s: list[float] | None = None  # a stream's per-row latency, time to first token, time per token after it
    ttft_s: list[float] | None = None
    tpot_s: list[float | None] | None = None


def run_batch(lm: LoadedModel, decoding: Decoding, prompts: list[PromptItem], seeds: list[int], slots=None) -> RawBatch:
    """The device half of a batch: one timed pass of the compacting loop or generate(), tokens copied back.

    With `slots` below the number of prompts (and `decoding.refill`), the prompts are one
    stream: `slots` rows decode at once and rows freed by finished generations take the next."""
    device = lm.device
    stream = decoding.refill and slots is not None and slots < len(prompts)
    enc = encode(lm, decoding, prompts[:slots] if stream else prompts)
    prompt_len = enc["input_ids"].shape[1]
    clock = StepClock(device)
    timing: dict = {}
    if decoding.own_loop:
        clock.start()
        out, recorder = _decode_own(
            lm, decoding, enc, clock, seeds, _refill(lm, decoding, prompts, slots) if stream else None
        )
        times = clock.stop()
        new, steps, compactions, kv = out.tokens, out.steps, out.compactions, out.kv_cache
        if stream:
            latency, ttft, tpot = out.timeline.seconds(times, out.finished.timed, decoding.config.max_new_tokens)
            timing = {"refills": out.admissions, "slots": slots, "latency_s": latency, "ttft_s": ttft, "tpot_s": tpot}
            enc = _encode_host(lm, decoding, prompts)
    else:
        processors = LogitsProcessorList([clock])
        if decoding.warpers_cfg is not None:
            processors.extend(build_warpers(decoding.warpers_cfg))
            processors.append(SeededSampler(seeds, device, max_steps=decoding.config.max_new_tokens))
        criteria = StoppingCriteriaList()
        recorder = None
        if decoding.config.num_beams == 1 and decoding.assistant is None:
            stop = StopStrings(lm.tokenizer, decoding.stop) if decoding.stop else None
            recorder = FinishRecorder(prompt_len, eos_ids(decoding.config), stop, len(prompts), device)
            criteria.append(recorder)
        elif decoding.loop is not None and decoding.stop:  # a beam loop's hypotheses end at stop strings too
            criteria.append(StopStrings(lm.tokenizer, decoding.stop))
        clock.start()
        out = _run(lm, decoding, enc, processors, criteria)
        times = clock.stop()
        new, steps, compactions, kv = out[:, prompt_len:].cpu(), out.shape[1] - prompt_len, None, None
    ids, mask = enc["input_ids"].cpu(), enc["attention_mask"].cpu()
    return RawBatch(len(prompts), ids, mask, new, recorder, times, steps, compactions, kv, **timing)


def finish_batch(tok, decoding: Decoding, raw: RawBatch) -> BatchOutput:
    """The host half of a batch: rows cut at their ends, detokenised, measured (no device work)."""
    texts, ids, reasons = _finish(tok, decoding, raw.new.tolist(), raw.recorder)
    mask = raw.attention_mask.tolist()
    prompt_ids = [[t for t, m in zip(r, mr) if m] for r, mr in zip(raw.input_ids.tolist(), mask)]
    times = raw.times
    timing = BatchTiming(
        n=raw.n,
        batch_size=raw.slots if raw.refills is not None else raw.n,
        input_tokens=int(raw.attention_mask.sum()),
        new_tokens=sum(len(s) for s in ids),
        prefill_s=times.prefill_s,
        total_s=times.total_s,
        decode_s=max(times.total_s - times.prefill_s, 0.0),
        steps=raw.steps,
        compactions=raw.compactions,
        refills=raw.refills,
        latency_s=[round(x, 6) for x in raw.latency_s] if raw.latency_s is not None else None,
        ttft_s=[round(x, 6) for x in raw.ttft_s] if raw.ttft_s is not None else None,
        tpot_s=[x if x is None else round(x, 6) for x in raw.tpot_s] if raw.tpot_s is not None else None,
    )
    return BatchOutput(texts, ids, reasons, prompt_ids, timing, raw.kv_cache)


def generate_batch(lm: LoadedModel, decoding: Decoding, prompts: list[PromptItem], seeds: list[int]) -> BatchOutput:
    """One batch of prompts, device and host halves in turn (the job overlaps them: worker.engine.job)."""
    return finish_batch(lm.tokenizer, decoding, run_batch(lm, decoding, prompts, seeds))


def run_with_oom_retry(
    lm: LoadedModel, decoding: Decoding, prompts, seeds, notes: list[str], slots=None
) -> list[RawBatch]:
    """A batch's device half; on CUDA out-of-memory, halve it and retry each half (recorded in notes).

    A stream (`slots`) retries with half the rows decoding at once."""
    try:
        return [run_batch(lm, decoding, prompts, seeds, slots)]
    except torch.cuda.OutOfMemoryError:
        if (slots or len(prompts)) == 1:
            raise
        torch.cuda.empty_cache()
        if slots is not None:
            notes.append(f"CUDA out of memory at {slots} rows: the stream retried with {slots // 2}")
            log.warning("batch.oom", batch_size=slots, retry_with=slots // 2)
            return run_with_oom_retry(lm, decoding, prompts, seeds, notes, slots // 2)
        half = len(prompts) // 2
        notes.append(f"CUDA out of memory at batch size {len(prompts)}: halved to {half} and retried")
        log.warning("batch.oom", batch_size=len(prompts), retry_with=half)
        return run_with_oom_retry(lm, decoding, prompts[:half], seeds[:half], notes) + run_with_oom_retry(
            lm, decoding, prompts[half:], seeds[half:], notes
        )


def warm_up(lm: LoadedModel, decoding: Decoding, prompts: list[PromptItem]) -> None:
    """One short untimed generate() per loaded model (kernels, allocator, caches)."""
    if lm.warmed:
        return
    short = GenerationConfig(
        **{**decoding.config.to_dict(), "max_new_tokens": 2, "min_new_tokens": None, "stop_strings": None}
    )
    enc = lm.tokenizer([p.prompt for p in prompts], return_tensors="pt", padding=True).to(lm.device)
    with torch.inference_mode():
        lm.model.generate(**enc, generation_config=short)
    synchronize(lm.device)
    lm.warmed = True
