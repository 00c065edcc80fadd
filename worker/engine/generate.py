"""Running one batch as the plan says: the device half (`run_batch`) and the host half (`finish_batch`).

`run_batch(lm, plan, prompts, seeds)` runs one left-padded batch, or with continuous refill one
stream of the job's prompts, on the path the plan chose (worker.engine.plan): the engine's decode
loop (worker.engine.decode.Loop) with the plan's token chooser and the model call over the plan's
cache, or transformers' generate(); timed by
`worker.engine.timing.StepClock`, sampling seeded per generation (`worker.engine.sampling`).
`finish_batch` cuts each row at its end, detokenises and measures, on the host. `warm_up` runs one
short untimed batch on the plan's own path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import structlog
import torch
from transformers import LogitsProcessorList, StoppingCriteriaList

from worker.core.contract import PromptItem
from worker.core.results import BatchTiming
from worker.engine import decode
from worker.engine.models import LoadedModel
from worker.engine.plan import Plan
from worker.engine.sampling import SeededSampler
from worker.engine.stops import FinishRecorder, NewTokens, first_holding
from worker.engine.timing import StepClock, StepTimes, synchronize

log = structlog.get_logger("decodebench.engine")


@dataclass
class BatchOutput:
    texts: list[str]
    token_ids: list[list[int]]
    stop_reasons: list[str]
    prompt_ids: list[list[int]]
    timing: BatchTiming


def _generate(lm: LoadedModel, plan: Plan, enc, processors, criteria):
    """transformers' generate() on one encoded batch (Path.GENERATE)."""
    with torch.inference_mode(), _draft_settings(plan) if plan.assistant is not None else nullcontext():
        return lm.model.generate(
            **enc,
            generation_config=plan.config,
            logits_processor=processors,
            stopping_criteria=criteria,
            tokenizer=lm.tokenizer if plan.config.stop_strings else None,
            assistant_model=plan.assistant.model if plan.assistant is not None else None,
        )


@contextmanager
def _draft_settings(plan: Plan) -> Iterator[None]:
    """The draft length and its schedule, set for one batch where transformers reads them: the draft model's own
    generation config (generate() never takes them from the config it is given, so the strategy's
    `num_assistant_tokens` and `schedule` did nothing). Put back after it: the heuristic schedule writes its state
    there after each call, and the draft model is shared by every job that loads it (a job of its own included,
    whose recorded generation config starts from it)."""
    draft = plan.assistant.model.generation_config
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule")
    before = {key: getattr(draft, key) for key in keys}
    for key in keys:
        setattr(draft, key, getattr(plan.config, key))
    try:
        yield
    finally:
        for key, value in before.items():
            setattr(draft, key, value)


@contextmanager
def _first_forward_stamped(model, clock: StepClock) -> Iterator[None]:
    """Assisted decoding's first logits: the end of the model's first forward pass (its prefill, with the first
    draft), stamped once. Its logits processors cannot stamp it: generate() hands them to the draft model's own
    generate() too, whose first logits come before any of the model's."""

    def stamp(module, args, output) -> None:
        clock.tick()
        handle.remove()

    handle = model.register_forward_hook(stamp)
    try:
        yield
    finally:
        handle.remove()


def _finish(tok, plan: Plan, new: list[list[int]], recorder: FinishRecorder | None):
    """Each row cut at its end (EOS, stop string or length): (texts, token ids, stop reasons)."""
    eos = set(plan.rules.ends.eos)
    texts, ids, reasons = [], [], []
    for row, seq in enumerate(new):
        if recorder is not None and recorder.finished[row] is not None:
            n, reason = recorder.finished[row]
        else:
            first_eos = next((i for i, t in enumerate(seq) if t in eos), None)
            n, reason = (first_eos + 1, "eos") if first_eos is not None else (len(seq), "length")
        seq = seq[:n]
        # the text is the reply alone: the end token (EOS, a chat model's end of turn) stays in the ids, out of the
        # text even where the tokenizer does not mark it special
        text = tok.decode(seq[:-1] if reason == "eos" and seq and seq[-1] in eos else seq, skip_special_tokens=True)
        cut = min((text.find(s) for s in plan.stop if s in text), default=-1)
        if cut >= 0:
            text, reason = text[:cut], "stop_string"
            if recorder is None and seq and seq[-1] in eos:  # generate() padded after the stop string: not a token
                seq = seq[:-1]
            if plan.assistant is not None:  # a verification step may have accepted tokens past the stop string
                seq = seq[: first_holding(lambda ids: tok.decode(ids, skip_special_tokens=True), seq, plan.stop)]
        texts.append(text)
        ids.append(seq)
        reasons.append(reason)
    return texts, ids, reasons


def encode(lm: LoadedModel, plan: Plan, prompts: list[PromptItem]) -> dict[str, torch.Tensor]:
    """The left-padded batch, from the shard's token ids when the job tokenised them once."""
    return {k: v.to(lm.device) for k, v in _encode_host(lm, plan, prompts).items()}


def _encode_host(lm: LoadedModel, plan: Plan, prompts: list[PromptItem]) -> dict[str, torch.Tensor]:
    tok = lm.tokenizer
    known = plan.prompt_ids
    if known is None or any(p.id not in known for p in prompts):
        enc = tok([p.prompt for p in prompts], return_tensors="pt", padding=True)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    rows = [known[p.id] for p in prompts]
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask}


def _refill(lm: LoadedModel, plan: Plan, prompts: list[PromptItem], slots: int) -> decode.Refill:
    """The job's prompts after the first `slots` as a queue the loop draws free rows from."""
    cursor = [slots]

    def next_rows(k: int):
        start = cursor[0]
        if start >= len(prompts) or k <= 0:
            return None
        batch = prompts[start : start + k]
        cursor[0] = start + len(batch)
        return encode(lm, plan, batch), start

    return decode.Refill(next_rows, total=len(prompts), slots=slots, longest=_longest(lm, plan, prompts))


def _longest(lm: LoadedModel, plan: Plan, prompts: list[PromptItem]) -> int:
    """The longest of the prompts in tokens: the width of their left-padded batch."""
    return _encode_host(lm, plan, prompts)["input_ids"].shape[1]


def check_every(device) -> int:
    """Steps between the decode loop's looks for finished rows: every step on the CPU, where a look
    costs nothing; every 8 on CUDA, where it is a host synchronisation."""
    return 1 if device.type == "cpu" else 8


def _decode(lm: LoadedModel, plan: Plan, enc, clock, seeds: list[int], refill=None):
    """The decode loop (worker.engine.decode) with the plan's chooser and model call: its output and a finish
    recorder of its rows' ends."""
    sampler = None
    if plan.sampler is not None:
        sampler = SeededSampler(seeds, lm.device, max_steps=plan.config.max_new_tokens)
    total = refill.total if refill is not None else enc["input_ids"].shape[0]
    chooser = plan.chooser(sampler, total, lm.device)
    loop = decode.Loop(plan.call(lm.model, clock), chooser, clock, check_every(lm.device), refill)
    out = loop.run(enc)
    recorder = FinishRecorder(enc["input_ids"].shape[1], [], None, len(seeds), "cpu")
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
    samples: int = 1  # generations each row of input_ids has (the decode loop's samples of one prefill)
    refills: int | None = None  # a stream's admissions of new rows (None: a plain batch)
    slots: int | None = None  # a stream's rows decoding at once
    latency_s: list[float] | None = None  # a stream's per-row latency, time to first token, time per token after it
    ttft_s: list[float] | None = None
    tpot_s: list[float | None] | None = None
    decode_step: dict | None = None  # what the static decode steps did (worker.engine.graphs.StepStats.record)


def run_batch(lm: LoadedModel, plan: Plan, prompts: list[PromptItem], seeds: list[int], slots=None) -> RawBatch:
    """The device half of a batch: one timed pass on the plan's path, tokens copied back.

    With `slots` below the number of prompts (and `plan.refill`), the prompts are one
    stream: `slots` rows decode at once and rows freed by finished generations take the next."""
    device = lm.device
    stream = plan.refill and slots is not None and slots < len(prompts)
    enc = encode(lm, plan, prompts[:slots] if stream else prompts)
    prompt_len = enc["input_ids"].shape[1]
    clock = StepClock(device)
    timing: dict = {}
    if plan.step is not None:
        clock.start()
        out, recorder = _decode(lm, plan, enc, clock, seeds, _refill(lm, plan, prompts, slots) if stream else None)
        times = clock.stop()
        new, steps, compactions = out.tokens, out.steps, out.compactions
        timing["samples"] = plan.samples
        if out.step is not None:
            timing["decode_step"] = out.step.record()
        if stream:
            latency, ttft, tpot = out.timeline.seconds(times, out.finished.timed, plan.config.max_new_tokens)
            timing |= {"refills": out.admissions, "slots": slots, "latency_s": latency, "ttft_s": ttft, "tpot_s": tpot}
            enc = _encode_host(lm, plan, prompts)
    else:
        if plan.samples > 1:  # generate() has no prefill to share: each sample its own row from the start
            enc = {k: v.repeat_interleave(plan.samples, dim=0) for k, v in enc.items()}
        assisted = plan.assistant is not None  # the first logits stamped by the model itself, not the draft
        processors = LogitsProcessorList([] if assisted else [clock])
        if plan.rules.warpers is not None:
            processors.extend(plan.rules.warpers)
            processors.append(SeededSampler(seeds, device, max_steps=plan.config.max_new_tokens))
        criteria = StoppingCriteriaList()
        recorder = None
        if plan.config.num_beams == 1 and plan.assistant is None:
            recorder = FinishRecorder(prompt_len, plan.rules.ends.eos, plan.rules.stop, len(seeds), device)
            criteria.append(recorder)
        elif plan.assistant is not None and plan.rules.stop is not None:
            criteria.append(NewTokens(plan.rules.stop, prompt_len))
        clock.start()
        with _first_forward_stamped(lm.model, clock) if assisted else nullcontext():
            out = _generate(lm, plan, enc, processors, criteria)
        times = clock.stop()
        new, steps, compactions = out[:, prompt_len:].cpu(), out.shape[1] - prompt_len, None
    ids, mask = enc["input_ids"].cpu(), enc["attention_mask"].cpu()
    return RawBatch(len(prompts), ids, mask, new, recorder, times, steps, compactions, **timing)


def finish_batch(tok, plan: Plan, raw: RawBatch) -> BatchOutput:
    """The host half of a batch: rows cut at their ends, detokenised, measured (no device work)."""
    texts, ids, reasons = _finish(tok, plan, raw.new.tolist(), raw.recorder)
    mask = raw.attention_mask.tolist()
    prompt_ids = [[t for t, m in zip(r, mr) if m] for r, mr in zip(raw.input_ids.tolist(), mask)]
    prompt_ids = [row for row in prompt_ids for _ in range(raw.samples)]  # each generation's prompt
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
        decode_step=raw.decode_step,
    )
    return BatchOutput(texts, ids, reasons, prompt_ids, timing)


def generate_batch(lm: LoadedModel, plan: Plan, prompts: list[PromptItem], seeds: list[int]) -> BatchOutput:
    """One batch of prompts, device and host halves in turn (the job overlaps them: worker.engine.job)."""
    return finish_batch(lm.tokenizer, plan, run_batch(lm, plan, prompts, seeds))


def run_with_oom_retry(lm: LoadedModel, plan: Plan, prompts, seeds, notes: list[str], slots=None) -> list[RawBatch]:
    """A batch's device half; on CUDA out-of-memory, halve it and retry each half (recorded in notes).

    A stream (`slots`) retries with half the rows decoding at once."""
    try:
        return [run_batch(lm, plan, prompts, seeds, slots)]
    except torch.cuda.OutOfMemoryError:
        if (slots or len(prompts)) == 1:
            raise
        torch.cuda.empty_cache()
        if slots is not None:
            notes.append(f"CUDA out of memory at {slots} rows: the stream retried with {slots // 2}")
            log.warning("batch.oom", batch_size=slots, retry_with=slots // 2)
            return run_with_oom_retry(lm, plan, prompts, seeds, notes, slots // 2)
        half = len(prompts) // 2
        notes.append(f"CUDA out of memory at batch size {len(prompts)}: halved to {half} and retried")
        log.warning("batch.oom", batch_size=len(prompts), retry_with=half)
        cut = half * plan.samples  # seeds are per generation: a prompt's samples' seeds follow one another
        return run_with_oom_retry(lm, plan, prompts[:half], seeds[:cut], notes) + run_with_oom_retry(
            lm, plan, prompts[half:], seeds[cut:], notes
        )


def warm_up(lm: LoadedModel, plan: Plan, prompts: list[PromptItem]) -> None:
    """One short untimed batch on the plan's own path (its loop, chooser and cache, or generate() with its
    draft model): kernels, allocator, caches; once per loaded model and code its batches run (`Plan.warm_key`, the
    draft model among it). An assisted plan's lazy imports every time."""
    if plan.assistant is not None:
        _assisted_imports()
    models = [lm] if plan.assistant is None else [lm, plan.assistant]  # a draft loaded again is cold again
    if all(plan.warm_key in m.warmed for m in models):
        return
    seeds = [0] * len(prompts) * plan.samples
    run_batch(lm, plan.shortened(2, None), prompts, seeds)
    synchronize(lm.device)
    for m in models:
        m.warmed.add(plan.warm_key)


def _assisted_imports() -> None:
    """What transformers' assisted decoding imports in its first call that tunes the draft's confidence threshold
    (scikit-learn's ROC curve, over a second on the CPU): the short warm-up never gets that far, so it fell in the
    job's first timed batch (which took 1.2 s against the next ones' 0.2 s)."""
    from transformers.utils import is_sklearn_available

    if is_sklearn_available():
        import sklearn.metrics  # noqa: F401
