"""The generation engine: batch, generate with a strategy's settings, measure.

Timing: a logits processor stamps every decoding step, so the prefill time (start of
generate() to the first logits: time to first token) is measured, not guessed, and
decode time is derived as total - prefill. On CUDA each stamp synchronises first.

Seeding: sampling strategies do not use transformers' batch-wide RNG. The engine
applies transformers' own warpers (temperature, top-k, top-p, min-p, typical,
epsilon, eta, in transformers' order) and then draws each row's token from a
torch.Generator seeded by that generation's own seed. A generation's text therefore
depends on its seed and prompt, not on which prompts share its batch (up to the
floating-point effects of padding, which on GPU can flip a rare near-tie).
"""

from __future__ import annotations

import hashlib
import importlib
import time
from dataclasses import dataclass
from typing import Any

import structlog
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation import logits_process as lp
from transformers.generation.stopping_criteria import StopStringCriteria

from worker.contract import BatchTiming, GenerationSettings, PromptItem, StrategySpec
from worker.models import LoadedModel
from worker.strategies import get_strategy

log = structlog.get_logger("decodebench.engine")

SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def generation_seed(job_seed: int, prompt_id: str) -> int:
    """Each generation's own seed: a hash of the job seed and the prompt id (63-bit)."""
    digest = hashlib.sha256(f"{job_seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer(LogitsProcessor):
    """Stamps the time of every decoding step; changes nothing."""

    def __init__(self, device) -> None:
        self.device = device
        self.stamps: list[float] = []

    def __call__(self, input_ids, scores):
        _sync(self.device)
        self.stamps.append(time.perf_counter())
        return scores


class SeededSampler(LogitsProcessor):
    """Samples each row from its own generator and returns scores whose argmax is that sample."""

    def __init__(self, seeds: list[int], device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids, scores):
        probs = torch.softmax(scores.float(), dim=-1)
        picks = torch.stack([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)])
        out = torch.full_like(scores, -float("inf"))
        return out.scatter_(1, picks, 0.0)


class FinishRecorder(StoppingCriteria):
    """Marks a row done at EOS or a stop string and records the step at which it finished."""

    def __init__(self, prompt_len: int, eos_ids: list[int], stop: StopStringCriteria | None, batch: int, device) -> None:
        self.prompt_len = prompt_len
        self.eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
        self.stop = stop
        self.finished: list[tuple[int, str] | None] = [None] * batch

    def __call__(self, input_ids, scores, **kwargs):
        last = input_ids[:, -1]
        is_eos = torch.isin(last, self.eos)
        is_stop = self.stop(input_ids, scores) if self.stop is not None else torch.zeros_like(is_eos)
        n_new = input_ids.shape[1] - self.prompt_len
        for row in torch.nonzero(is_eos | is_stop).flatten().tolist():
            if self.finished[row] is None:
                self.finished[row] = (n_new, "eos" if bool(is_eos[row]) else "stop_string")
        return is_eos | is_stop


def build_warpers(cfg: dict[str, Any]) -> list[LogitsProcessor]:
    """transformers' own warpers for a sampling config, in the order generate() applies them."""
    w: list[LogitsProcessor] = []
    if (cfg.get("temperature") or 1.0) != 1.0:
        w.append(lp.TemperatureLogitsWarper(cfg["temperature"]))
    if cfg.get("top_k"):
        w.append(lp.TopKLogitsWarper(top_k=cfg["top_k"]))
    if (cfg.get("top_p") or 1.0) < 1.0:
        w.append(lp.TopPLogitsWarper(top_p=cfg["top_p"]))
    if cfg.get("min_p") is not None:
        w.append(lp.MinPLogitsWarper(min_p=cfg["min_p"]))
    if (cfg.get("typical_p") or 1.0) < 1.0:
        w.append(lp.TypicalLogitsWarper(mass=cfg["typical_p"]))
    if cfg.get("epsilon_cutoff"):
        w.append(lp.EpsilonLogitsWarper(epsilon=cfg["epsilon_cutoff"]))
    if cfg.get("eta_cutoff"):
        w.append(lp.EtaLogitsWarper(epsilon=cfg["eta_cutoff"], device=cfg["_device"]))
    return w


def build_modifiers(cfg: GenerationConfig, prompt_len: int) -> list[LogitsProcessor]:
    """The processors generate() would add for penalties and minimum length (for custom loops)."""
    m: list[LogitsProcessor] = []
    if cfg.min_new_tokens:
        m.append(lp.MinNewTokensLengthLogitsProcessor(prompt_len, cfg.min_new_tokens, cfg.eos_token_id))
    if cfg.repetition_penalty not in (None, 1.0):
        m.append(lp.RepetitionPenaltyLogitsProcessor(penalty=cfg.repetition_penalty))
    if cfg.no_repeat_ngram_size:
        m.append(lp.NoRepeatNGramLogitsProcessor(cfg.no_repeat_ngram_size))
    return m


@dataclass
class Plan:
    """How one job calls generate() (or a strategy's own loop): the config and the sampling set-up."""

    config: GenerationConfig
    warpers_cfg: dict[str, Any] | None  # sampling settings applied by the engine, or None
    stop: list[str]
    loop: str | None = None  # "module:function" of a strategy's own decoding loop
    loop_params: dict[str, Any] | None = None
    assistant_path: str | None = None  # assisted decoding: the draft model to load
    assistant: LoadedModel | None = None

    def describe(self) -> dict[str, Any]:
        out = self.config.to_dict()
        if self.loop is not None:
            out["decodebench_loop"] = {"function": self.loop, **(self.loop_params or {})}
        if self.assistant is not None:
            out["decodebench_assistant"] = self.assistant.info
        if self.warpers_cfg is not None:
            out["decodebench_sampler"] = {
                "method": "per-generation seeded multinomial after transformers warpers",
                **{k: v for k, v in self.warpers_cfg.items() if not k.startswith("_")},
            }
        return out


def make_plan(lm: LoadedModel, strategy: StrategySpec, settings: GenerationSettings) -> Plan:
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
    return Plan(cfg, warpers_cfg, list(settings.stop), registered.loop, loop_params, params.get("assistant"))


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


def _eos_ids(cfg: GenerationConfig) -> list[int]:
    eos = cfg.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def generate_batch(lm: LoadedModel, plan: Plan, prompts: list[PromptItem], seeds: list[int]) -> BatchOutput:
    """One generate() call on a batch of prompts, timed."""
    tok, device = lm.tokenizer, lm.device
    enc = tok([p.prompt for p in prompts], return_tensors="pt", padding=True).to(device)
    prompt_len = enc["input_ids"].shape[1]
    timer = StepTimer(device)
    processors = LogitsProcessorList([timer])
    if plan.warpers_cfg is not None:
        processors.extend(build_warpers(plan.warpers_cfg))
        processors.append(SeededSampler(seeds, device))
    criteria = StoppingCriteriaList()
    recorder = None
    if plan.config.num_beams == 1 and plan.assistant is None:
        stop = StopStringCriteria(tok, plan.stop) if plan.stop else None
        recorder = FinishRecorder(prompt_len, _eos_ids(plan.config), stop, len(prompts), device)
        criteria.append(recorder)
    _sync(device)
    start = time.perf_counter()
    if plan.loop is not None:
        processors.extend(build_modifiers(plan.config, prompt_len))
        out = _import(plan.loop)(lm.model, enc, plan.config, plan.loop_params, processors, criteria)
    else:
        with torch.inference_mode():
            out = lm.model.generate(
                **enc,
                generation_config=plan.config,
                logits_processor=processors,
                stopping_criteria=criteria,
                tokenizer=tok if plan.config.stop_strings else None,
                assistant_model=plan.assistant.model if plan.assistant is not None else None,
            )
    _sync(device)
    total = time.perf_counter() - start
    prefill = (timer.stamps[0] - start) if timer.stamps else total
    new = out[:, prompt_len:].tolist()
    eos = set(_eos_ids(plan.config))
    texts, ids, reasons = [], [], []
    for row, seq in enumerate(new):
        if recorder is not None and recorder.finished[row] is not None:
            n, reason = recorder.finished[row]
        else:
            first_eos = next((i for i, t in enumerate(seq) if t in eos), None)
            n, reason = (first_eos + 1, "eos") if first_eos is not None else (len(seq), "length")
        seq = seq[:n]
        text = tok.decode(seq, skip_special_tokens=True)
        cut = min((text.find(s) for s in plan.stop if s in text), default=-1)
        if cut >= 0:
            text, reason = text[:cut], "stop_string"
        texts.append(text)
        ids.append(seq)
        reasons.append(reason)
    mask = enc["attention_mask"].tolist()
    prompt_ids = [[t for t, m in zip(r, mr) if m] for r, mr in zip(enc["input_ids"].tolist(), mask)]
    timing = BatchTiming(
        n=len(prompts),
        batch_size=len(prompts),
        input_tokens=int(enc["attention_mask"].sum()),
        new_tokens=sum(len(s) for s in ids),
        prefill_s=prefill,
        total_s=total,
        decode_s=max(total - prefill, 0.0),
        steps=out.shape[1] - prompt_len,
    )
    return BatchOutput(texts, ids, reasons, prompt_ids, timing)


def generate_with_oom_retry(lm: LoadedModel, plan: Plan, prompts, seeds, notes: list[str]) -> list[BatchOutput]:
    """Generate a batch; on CUDA out-of-memory, halve it and retry each half (recorded in notes)."""
    try:
        return [generate_batch(lm, plan, prompts, seeds)]
    except torch.cuda.OutOfMemoryError:
        if len(prompts) == 1:
            raise
        torch.cuda.empty_cache()
        half = len(prompts) // 2
        notes.append(f"CUDA out of memory at batch size {len(prompts)}: halved to {half} and retried")
        log.warning("batch.oom", batch_size=len(prompts), retry_with=half)
        return generate_with_oom_retry(lm, plan, prompts[:half], seeds[:half], notes) + generate_with_oom_retry(
            lm, plan, prompts[half:], seeds[half:], notes
        )


def warm_up(lm: LoadedModel, plan: Plan, prompts: list[PromptItem]) -> None:
    """One short untimed generate() per loaded model (kernels, allocator, caches)."""
    if lm.warmed:
        return
    short = GenerationConfig(**{**plan.config.to_dict(), "max_new_tokens": 2, "min_new_tokens": None, "stop_strings": None})
    enc = lm.tokenizer([p.prompt for p in prompts], return_tensors="pt", padding=True).to(lm.device)
    with torch.inference_mode():
        lm.model.generate(**enc, generation_config=short)
    _sync(lm.device)
    lm.warmed = True


def score_nll(scorer: LoadedModel, pairs: list[tuple[list[int], list[int]]], batch_size: int) -> list[tuple[float | None, int | None]]:
    """Sum of negative log-likelihoods of each continuation given its context, batched (left padding)."""
    out: list[tuple[float | None, int | None]] = []
    pad = scorer.tokenizer.pad_token_id
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        width = max(len(c) + len(g) for c, g in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        target = torch.zeros((len(chunk), width), dtype=torch.bool)
        for r, (ctx, gen) in enumerate(chunk):
            seq = ctx + gen
            ids[r, width - len(seq) :] = torch.tensor(seq)
            attn[r, width - len(seq) :] = 1
            target[r, width - len(gen) :] = bool(gen)
        ids, attn, target = ids.to(scorer.device), attn.to(scorer.device), target.to(scorer.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = scorer.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        mask = target[:, 1:]
        nll = -(logp * mask).sum(-1)
        for r, (ctx, gen) in enumerate(chunk):
            out.append((float(nll[r]), len(gen)) if gen and ctx else (None, None))
    return out
