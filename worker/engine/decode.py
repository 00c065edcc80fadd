"""The engine's decode loop: the scheduling of a batch's rows, where rows that finish stop costing compute.

`Loop(call, chooser, clock, every, refill).run(enc)` runs one left-padded batch like transformers'
generate() does for greedy search and sampling (prefill with the last position's logits only,
then one token per step over a KV cache, positions from the attention mask). It is the third of
the decode step's three parts: the model call (worker.engine.call: the prefill and one forward
over the plan's cache), the token choice (worker.engine.choose: penalties, warpers, the seeded
sampler; a strategy's own in worker.engine.loops and plugins) and this loop, which schedules: the
step clock, the checks for finished rows, admission and refill, and stopping. What it adds is
**compaction**: at a check every `every` steps (every step on CPU, where a check costs nothing;
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
drawing with its own seed, and the prompt never goes through the model again. A chooser whose prompts
occupy several rows (beam search: `rows_each`) still gets compaction and refill. The cache is the
preallocated one (worker.engine.kvcache) or, where the model's layers are not plain, transformers'
own, behind the same calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from worker.engine.call import ModelCall
from worker.engine.choose import Chooser, Finished
from worker.engine.graphs import StepStats
from worker.engine.kvcache import room
from worker.engine.rows import Rows
from worker.engine.timing import StepClock


@dataclass
class DecodeOutput:
    tokens: torch.Tensor  # (rows, steps) on the CPU: every token a row was given (cut later at its finish)
    finished: Finished
    steps: int  # decoding steps run (the longest row; with refill, the loop's)
    compactions: int  # times finished rows were dropped from the batch
    timeline: Timeline  # per row: its start, first token and the loop step of its second (clock marks, steps)
    admissions: int | None = None  # times free rows were refilled from the queue (None: no refill)
    step: StepStats | None = None  # what the static decode steps did (worker.engine.graphs; None: none ran)


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
class Loop:
    """The scheduling of one decode call: the prefill, a step at a time (the clock stamps each), the checks
    that drop finished rows and admit the queue's next prompts, and the stop."""

    call: ModelCall
    chooser: Chooser
    clock: StepClock
    every: int = 1  # steps between checks
    refill: Refill | None = None
    timeline: Timeline = field(init=False, repr=False)  # per queued generation, set by `run`

    def run(self, enc: dict[str, torch.Tensor]) -> DecodeOutput:
        """One batch (or, with `refill`, one stream) through the loop: the chooser picks the tokens, the loop
        compacts as rows finish (and refills free rows)."""
        chooser, refill, every, clock = self.chooser, self.refill, self.every, self.clock
        ends, n = chooser.ends, chooser.samples
        total = refill.total if refill is not None else enc["input_ids"].shape[0]
        rows = Rows(enc["input_ids"], enc["attention_mask"], ends, total=total * n)
        cache = self._buffers(rows)
        if refill is not None and cache is None:
            raise ValueError("continuous refill needs the preallocated KV cache")
        if chooser.sampler is not None:
            chooser.sampler.rows = rows.live  # the sampler's seeds are the queue's; the live rows are its first
        self.timeline = Timeline(total * n)
        forward, advance = chooser.forward_of(self.call), chooser.advance
        steps = compactions = 0
        with torch.inference_mode():
            out, cache = self._prefill(rows, cache)
            while True:
                clock.tick()
                advance(out, rows, cache)
                if steps == 0:
                    self.timeline.started(range(enc["input_ids"].shape[0] * n), 0, clock.mark(), 1)
                steps += 1
                if refill is None and steps == ends.max_new:
                    break
                if steps % every == 0 or steps == 1:  # and after the first token: rows that end at once go
                    compactions += self.check(rows, cache, steps)
                    if rows.live.numel() == 0:
                        break
                out, cache = forward(rows, cache)
        return self._output(rows, steps, compactions)

    def _prefill(self, rows: Rows, cache):
        """The rows' prompts through the model (each prompt's samples: its prefilled row and cache repeated,
        not prefilled again), then what the chooser takes from them: (output, cache)."""
        chooser = self.chooser
        out, cache = self.call.prefill(rows, cache, **chooser.prefill_options)
        if chooser.samples > 1:
            last = out.logits[:, -1:]
            rows.expand(chooser.samples, cache)
            out.logits = last.repeat_interleave(chooser.samples, dim=0)
            if chooser.sampler is not None:
                chooser.sampler.rows = rows.live
        return chooser.prefilled(self.call, out, rows, cache), cache

    def check(self, rows: Rows, cache, steps: int) -> bool:
        """Drop finished rows (one synchronisation) and refill free ones; whether rows were dropped."""
        live = rows.unfinished.nonzero().squeeze(1)
        compacted = live.numel() < rows.live.numel()
        if compacted:
            rows.keep(live, cache, self.chooser.sampler)
        if self.refill is not None:
            self.fill(rows, cache, steps)
            room(cache, self.every + self.chooser.spare)  # the next checks' steps fit without growing
        return compacted

    def fill(self, rows: Rows, cache, steps: int) -> None:
        """Admit the queue's next prompts while a quarter of the rows (at least one) is free: several
        admissions where newcomers end at their first token (they never join)."""
        slots = self.refill.slots
        while slots - _prompts(rows, self.chooser.rows_each) >= max(1, slots // 4):
            if not self.admit(rows, cache, steps):
                return

    def admit(self, rows: Rows, cache, steps: int) -> bool:
        """Prefill the next prompts into the free rows, pick their first tokens, merge those that go on
        into `rows` and the stream's KV buffers: False when the queue is empty.

        `steps`: the loop steps so far; the newcomers' second tokens come from the next one."""
        chooser, refill = self.chooser, self.refill
        got = refill.next(refill.slots - _prompts(rows, chooser.rows_each))
        if got is None:
            return False
        enc, first = got
        mark = self.clock.mark()
        new = Rows(enc["input_ids"], enc["attention_mask"], chooser.ends, first=first, queue=rows)
        if chooser.sampler is not None:
            chooser.sampler.rows = new.live
        rows_new = enc["input_ids"].shape[0] * chooser.rows_each
        out, new_cache = self._prefill(new, self.call.buffers(new.width + chooser.spare, rows_new))
        chooser.advance(out, new, new_cache)
        n = chooser.samples
        self.timeline.started(range(first * n, (first + enc["input_ids"].shape[0]) * n), mark, self.clock.mark(), steps)
        refill.admissions += 1
        going = new.unfinished.nonzero().squeeze(1)  # not those that ended at once (EOS, a stop, max_new 1)
        if going.numel() < new.live.numel():
            new.keep(going, new_cache, None)
        if going.numel():
            rows.merge(new, cache, new_cache, chooser.sampler)
        elif chooser.sampler is not None:
            chooser.sampler.rows = rows.live
        return True

    def _buffers(self, rows: Rows):
        """The preallocated KV cache of a batch (prompt + max_new columns) or of a stream (its slots and
        stream_span columns), each with the chooser's spare columns and its rows per prompt; None where the
        plan chose transformers' own cache (the model's layers are not plain, or the chooser repeats rows)."""
        chooser, refill, max_new = self.chooser, self.refill, self.chooser.ends.max_new
        if refill is None:
            return self.call.buffers(rows.width + max_new + chooser.spare, rows.live.numel() * chooser.rows_each)
        span = stream_span(max(refill.longest, rows.width), max_new, self.every) + chooser.spare
        return self.call.buffers(span, refill.slots * chooser.rows_each)

    def _output(self, rows: Rows, steps: int, compactions: int) -> DecodeOutput:
        chooser, refill = self.chooser, self.refill
        finished = chooser.finish(rows)
        width = chooser.ends.max_new if refill is not None else steps
        admissions = refill.admissions if refill is not None else None
        tokens = chooser.tokens[:, :width].cpu()
        return DecodeOutput(tokens, finished, steps, compactions, self.timeline, admissions, self.call.step_stats())


def _prompts(rows: Rows, each: int) -> int:
    """The prompts the live rows hold, `each` rows a prompt (a prompt with a row still live counts whole)."""
    return -(-rows.live.numel() // each)


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
