"""The engine's decode loop: a step object over a KV cache, where rows that finish stop costing compute.

`decode(step, enc)` runs one left-padded batch like transformers' generate() does for greedy
search and sampling (prefill with the last position's logits only, then one token per
step over a KV cache, positions from the attention mask), with decodebench's pieces
plugged in: the step clock, the penalties applied row by row (worker.engine.modifiers),
transformers' warpers and the vectorised seeded sampler. What it adds is **compaction**:
at a check every `check_every` steps (every step on CPU, where a check costs nothing;
every 8 on CUDA, so that there is no host synchronisation per token), and once after the
first token (rows that end at once, say at max_new_tokens 1, take no step), the rows that have
finished (EOS or a stop string) are dropped from the batch: from the token ids, the
attention mask and every layer of the KV cache. The remaining rows compute exactly what they computed
before, so greedy outputs are those of the unbatched run, and a sampled row draws with
its own (seed, step) uniforms whichever rows remain.

With a `Refill`, the job's prompts are one stream: rows freed by finished generations are
prefilled from the queue and merged in (continuous refill), in KV buffers allocated once
(`stream_span`). With `samples` n > 1 (sampling), a prompt's row is prefilled once and then repeated n
times, its KV cache rows with it (`Rows.expand`): its n generations are queue rows of their own, each
drawing with its own seed, and the prompt never goes through the model again. `Step` is greedy search's
and sampling's step; a subclass picks tokens
otherwise and still gets compaction and refill: contrastive search's `ContrastiveStep`
(worker.engine.loops.contrastive) and beam search's `BeamStep` (worker.engine.loops.beam_step),
whose prompts occupy `rows_each` rows each. A step is built by keyword (`Step.build`) from what
the plan chose (worker.engine.plan); the cache is the preallocated one (worker.engine.kvcache)
or, where the model's layers are not plain, transformers' own, behind the same calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import LogitsProcessorList, PreTrainedModel

from worker.engine.kvcache import preallocated_cache, room
from worker.engine.models import probes, sdpa_mask
from worker.engine.modifiers import RowModifiers
from worker.engine.rows import Rows
from worker.engine.sampling import SeededSampler
from worker.engine.stops import StopStrings
from worker.engine.timing import StepClock


@dataclass
class Finished:
    """Per original row: new tokens when it finished (-1: ran to the end) and whether at EOS."""

    n_new: list[int]
    at_eos: list[bool]
    steps: list[int] | None = None  # per row, the loop steps it took where that differs from n_new (beams)

    @property
    def timed(self) -> list[int]:
        """Per row, the tokens up to its finish as the clock sees it (its end's loop step)."""
        return self.steps if self.steps is not None else self.n_new


@dataclass
class DecodeOutput:
    tokens: torch.Tensor  # (rows, steps) on the CPU: every token a row was given (cut later at its finish)
    finished: Finished
    steps: int  # decoding steps run (the longest row; with refill, the loop's)
    compactions: int  # times finished rows were dropped from the batch
    kv_cache: str  # "preallocated" (worker.engine.kvcache) or "dynamic" (transformers' own)
    timeline: Timeline  # per row: its start, first token and the loop step of its second (clock marks, steps)
    admissions: int | None = None  # times free rows were refilled from the queue (None: no refill)


def stream_span(longest: int, max_new: int, every: int) -> int:
    """Columns of a continuous-refill stream's KV buffers (allocated once, `slots` rows).

    Right after a check, every row has at most its prompt and the tokens it has been given in
    the cache: rows join right-aligned, the columns no row attends to are dropped, and the
    finished rows are gone, so the others have had at most max_new - 1 tokens, the last not
    yet in the cache (newcomers: their prompt). The live columns are then at most
    `longest + max(max_new - 2, 0)`, and the `every` steps to the next check add as many.
    Before those steps the window slides to the front of the buffers where their end is
    that near (kvcache.room): a reserve of `max(2 * every, max_new // 4)` columns makes a slide
    (one copy of the live cache) rare. Without the slide the buffers would need room for a
    newcomer's max_new after an old row's whole history: longest + 2 * max_new."""
    return longest + max_new + every + max(2 * every, max_new // 4)


@dataclass
class Refill:
    """Continuous refill: `next(k)` encodes the job's next k prompts (None when none are left)."""

    next: Callable[[int], tuple[dict, int] | None]  # k -> (encoded batch, queue index of its first row)
    total: int  # prompts in the queue
    slots: int  # rows decoding at once
    longest: int  # the longest prompt of the queue, in tokens
    admissions: int = 0


@dataclass
class Step:
    """Greedy search's and sampling's step of the decode loop, and what every step of one decode call
    uses; the rows and their KV cache are passed along. Built by keyword: `Step.build`."""

    model: PreTrainedModel
    clock: StepClock
    processors: RowModifiers  # the penalties and minimum length, each row's own
    warpers: LogitsProcessorList | None  # sampling's transformers warpers (None: greedy)
    sampler: SeededSampler | None
    stop: StopStrings | None
    eos: list[int]
    pad: int | None
    max_new: int
    tokens: torch.Tensor  # (queue rows, max_new + 1): the output, one spare column for finished rows
    timeline: Timeline
    cache_keyword: str = "cache"  # the model's KV-cache keyword (models.probes)
    last_logits: bool = False  # the model takes `logits_to_keep`: the prefill computes the last logits only
    mask: bool = False  # decode steps pass the prepared 4D mask (the plan's, with the preallocated cache)
    every: int = 1  # steps between checks
    preallocated: bool = True  # the plan's cache: kvcache's preallocated buffers, else transformers' own
    samples: int = 1  # generations per prompt: its row is prefilled once, then repeated (sampling)

    describe: ClassVar[str | None] = None  # what result.json says of a step other than greedy's and sampling's

    @classmethod
    def options(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """The step's own fields from the strategy's parameters (none for greedy search and sampling)."""
        return {}

    @classmethod
    def build(
        cls,
        *,
        model: PreTrainedModel,
        params: Mapping[str, Any],
        clock: StepClock,
        processors: RowModifiers,
        warpers: LogitsProcessorList | None,
        sampler: SeededSampler | None,
        stop: StopStrings | None,
        eos: list[int],
        pad: int | None,
        max_new: int,
        total: int,
        device: torch.device,
        mask: bool,
        every: int,
        preallocated: bool = True,
        samples: int = 1,
    ) -> Step:
        """The step of one decode call: an output row per queued generation (`total` prompts x `samples`;
        max_new + 1 columns: one spare for finished rows), the model's keywords (models.probes)."""
        found = probes(model)
        fill = pad if pad is not None else (eos[0] if eos else 0)  # as Rows pads
        return cls(
            model=model,
            clock=clock,
            processors=processors,
            warpers=warpers,
            sampler=sampler,
            stop=stop,
            eos=eos,
            pad=pad,
            max_new=max_new,
            tokens=torch.full((total * samples, max_new + 1), fill, dtype=torch.long, device=device),
            timeline=Timeline(total * samples),
            cache_keyword=found.cache_keyword,
            last_logits=found.last_logits,
            mask=mask,
            every=every,
            preallocated=preallocated,
            samples=samples,
            **cls.options(params),
        )

    @property
    def spare(self) -> int:
        """KV columns a step needs beyond the one per token (a step that writes more)."""
        return 0

    @property
    def rows_each(self) -> int:
        """Rows one prompt occupies (its samples; beam search: its beams)."""
        return self.samples

    def finish(self, rows: Rows) -> Finished:
        """Each queued prompt's end, once the loop is over (a step that picks its outputs at the end
        writes them here)."""
        return Finished(rows.n_new.tolist(), rows.at_eos.tolist())

    def prefill(self, rows: Rows, prealloc, **more):
        """The rows' prompts through the model into `prealloc` (or transformers' cache): (output, cache)."""
        pos = (rows.attn.cumsum(-1) - 1).clamp(min=0)
        if self.last_logits:
            more = {"logits_to_keep": 1, **more}
        if prealloc is not None:
            more = {self.cache_keyword: prealloc, **more}
        out = self.model(input_ids=rows.ids, attention_mask=rows.attn, position_ids=pos, use_cache=True, **more)
        cache = getattr(out, self.cache_keyword)
        if self.samples > 1:  # each prompt's samples: its prefilled row and cache repeated, not prefilled again
            last = out.logits[:, -1:]
            rows.expand(self.samples, cache)
            out.logits = last.repeat_interleave(self.samples, dim=0)
            if self.sampler is not None:
                self.sampler.rows = rows.live
        return out, cache

    def forward(self, rows: Rows, cache):
        kwargs = {self.cache_keyword: cache}
        mask = sdpa_mask(rows.attn) if self.mask else rows.attn
        out = self.model(
            input_ids=rows.ids[:, -1:], attention_mask=mask, position_ids=rows.pos, use_cache=True, **kwargs
        )
        return out, getattr(out, self.cache_keyword)

    def advance(self, out, rows: Rows, clocked: bool = True) -> None:
        """Pick each live row's next token from the logits (the clock stamps a loop step), append it."""
        scores = out.logits[:, -1].to(dtype=torch.float32, copy=True)
        scores = self.clock(rows.ids, scores) if clocked else scores
        scores = self.processors(rows, scores)
        if self.sampler is None:
            nxt = scores.argmax(dim=-1)
        else:
            nxt = self.sampler.pick(self.warpers(rows.ids, scores), rows.steps)
        nxt, column = rows.advance(nxt, scores, self.stop)
        self.tokens[rows.live, column] = nxt

    def check(self, rows: Rows, cache, refill: Refill | None, steps: int) -> bool:
        """Drop finished rows (one synchronisation) and refill free ones; whether rows were dropped."""
        live = rows.unfinished.nonzero().squeeze(1)
        compacted = live.numel() < rows.live.numel()
        if compacted:
            rows.keep(live, cache, self.sampler)
        if refill is not None:
            self.fill(refill, rows, cache, steps)
            room(cache, self.every + self.spare)  # the next checks' steps fit without growing
        return compacted

    def fill(self, refill: Refill, rows: Rows, cache, steps: int) -> None:
        """Admit the queue's next prompts while a quarter of the rows (at least one) is free: several
        admissions where newcomers end at their first token (they never join)."""
        while refill.slots - _prompts(rows, self.rows_each) >= max(1, refill.slots // 4):
            if not self.admit(refill, rows, cache, steps):
                return

    def admit(self, refill: Refill, rows: Rows, cache, steps: int) -> bool:
        """Prefill the next prompts into the free rows, pick their first tokens, merge those that go on
        into `rows` and the stream's KV buffers: False when the queue is empty.

        `steps`: the loop steps so far; the newcomers' second tokens come from the next one."""
        got = refill.next(refill.slots - _prompts(rows, self.rows_each))
        if got is None:
            return False
        enc, first = got
        mark = self.clock.mark()
        new = Rows(enc["input_ids"], enc["attention_mask"], self.eos, self.pad, self.max_new, first=first, queue=rows)
        if self.sampler is not None:
            self.sampler.rows = new.live
        rows_new = enc["input_ids"].shape[0] * self.rows_each
        out, new_cache = self.prefill(new, preallocated_cache(self.model, new.width + self.spare, rows=rows_new))
        self.advance(out, new, clocked=False)
        n = self.samples
        self.timeline.started(range(first * n, (first + enc["input_ids"].shape[0]) * n), mark, self.clock.mark(), steps)
        refill.admissions += 1
        going = new.unfinished.nonzero().squeeze(1)  # not those that ended at once (EOS, a stop, max_new 1)
        if going.numel() < new.live.numel():
            new.keep(going, new_cache, None)
        if going.numel():
            rows.merge(new, cache, new_cache, self.sampler)
        elif self.sampler is not None:
            self.sampler.rows = rows.live
        return True


def decode(step: Step, enc: dict[str, torch.Tensor], refill: Refill | None = None) -> DecodeOutput:
    """One batch (or, with `refill`, one stream) through the decode loop: `step` picks the tokens, the
    loop compacts as rows finish (and refills free rows)."""
    max_new, every = step.max_new, step.every
    total = refill.total if refill is not None else enc["input_ids"].shape[0]
    rows = Rows(enc["input_ids"], enc["attention_mask"], step.eos, step.pad, max_new, total=total * step.samples)
    prealloc = _buffers(step, rows, refill)
    if refill is not None and prealloc is None:
        raise ValueError("continuous refill needs the preallocated KV cache")
    if step.sampler is not None:
        step.sampler.rows = rows.live  # the sampler's seeds are the queue's; the live rows are its first
    steps = compactions = 0
    with torch.inference_mode():
        out, cache = step.prefill(rows, prealloc)
        while True:
            step.advance(out, rows)
            if steps == 0:
                step.timeline.started(range(enc["input_ids"].shape[0] * step.samples), 0, step.clock.mark(), 1)
            steps += 1
            if refill is None and steps == max_new:
                break
            if steps % every == 0 or steps == 1:  # and after the first token: rows that end at once go
                compactions += step.check(rows, cache, refill, steps)
                if rows.live.numel() == 0:
                    break
            out, cache = step.forward(rows, cache)
    return _output(step, rows, steps, compactions, prealloc is not None, refill)


def _prompts(rows: Rows, each: int) -> int:
    """The prompts the live rows hold, `each` rows a prompt (a prompt with a row still live counts whole)."""
    return -(-rows.live.numel() // each)


def _buffers(step: Step, rows: Rows, refill: Refill | None):
    """The preallocated KV cache of a batch (prompt + max_new columns) or of a stream (its slots and
    stream_span columns), each with the step's spare columns and its rows per prompt; None where the
    plan chose transformers' own cache (the model's layers are not plain, or the step repeats rows)."""
    if not step.preallocated:
        return None
    if refill is None:
        columns = rows.width + step.max_new + step.spare
        return preallocated_cache(step.model, columns, rows=rows.live.numel() * step.rows_each)
    span = stream_span(max(refill.longest, rows.width), step.max_new, step.every) + step.spare
    return preallocated_cache(step.model, span, rows=refill.slots * step.rows_each)


def _output(step: Step, rows: Rows, steps: int, compactions: int, preallocated: bool, refill) -> DecodeOutput:
    finished = step.finish(rows)
    kind = "preallocated" if preallocated else "dynamic"
    width = step.max_new if refill is not None else steps
    admissions = refill.admissions if refill is not None else None
    return DecodeOutput(step.tokens[:, :width].cpu(), finished, steps, compactions, kind, step.timeline, admissions)


class Timeline:
    """Per queue row: the clock marks of its start and first token, and the loop step of its second token.

    A row's n-th token is picked at loop step `second + n - 2`, so its finish is that step's
    stamp: exact to the step, although the loop looks for finished rows only at its checks."""

    def __init__(self, total: int) -> None:
        self.start = [0] * total
        self.first = [0] * total
        self.second = [1] * total

    def started(self, rows: range, start: int, first: int, second: int) -> None:
        for row in rows:
            self.start[row], self.first[row], self.second[row] = start, first, second

    def seconds(self, times, n_new: list[int], max_new: int) -> tuple[list[float], list[float], list[float | None]]:
        """Per row, in seconds: latency, time to first token and time per output token after the
        first (None for a one-token generation). `times`: the clock's StepTimes; `n_new`: each
        row's tokens (-1: it ran to max_new)."""
        latency, ttft, tpot = [], [], []
        for start, first, second, n in zip(self.start, self.first, self.second, n_new):
            n = n if n > 0 else max_new
            t0, t1 = times.marks[start], times.marks[first]
            end = times.step_s[second + n - 2] if n > 1 else t1
            latency.append(end - t0)
            ttft.append(t1 - t0)
            tpot.append((end - t1) / (n - 1) if n > 1 else None)
        return latency, ttft, tpot
