"""The engine's own decoding loop for greedy and sampling: rows that finish stop costing compute.

`decode(...)` runs one left-padded batch like transformers' generate() does for greedy
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
(`stream_span`). A `Loop` subclass can pick tokens otherwise and still get compaction and
refill: contrastive search's `Step` (worker.engine.loops.contrastive) and beam search's
`BeamStep` (worker.engine.loops.beam_step), whose prompts occupy `rows_each` rows each.

Configurations whose processors the loop does not rebuild (`supports`) keep using
generate().
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from worker.engine.kvcache import preallocated_cache, room
from worker.engine.modifiers import only_modifiers
from worker.engine.rows import Rows

# Model families whose forward uses the attention mask only to build its causal mask (read in
# transformers 5.24's modeling files), so a ready 4D boolean mask passes through unchanged.
_MASK_PASSTHROUGH = frozenset(
    {"gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "phi3", "gemma", "olmo2", "smollm3"}
)


def prepared_mask(model) -> bool:
    """Whether decode steps give SDPA its boolean mask ready-made (rows.attn as (rows, 1, 1, columns)),
    given the preallocated cache (plain full-attention layers: a sliding-window layer needs
    transformers' own mask).

    transformers rebuilds the mask from the 2D one at every step, and for SDPA checks whether it
    has any padding (`fast_all`): a host synchronisation per token on CUDA, and on the CPU a
    little of a small model's step. The prepared mask is the same mask. The families listed were
    read in transformers 5.24; a model of one is also checked once, when first asked (another
    transformers release may read the mask otherwise): a decode step of a padded batch must give
    bit-identical logits with either mask, or the loop keeps transformers' mask for it.
    """
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa" or config.model_type not in _MASK_PASSTHROUGH:
        return False
    ok = getattr(model, "_decodebench_mask_ok", None)
    if ok is None:
        ok = _same_logits_either_mask(model)
        model._decodebench_mask_ok = ok  # once per loaded model
    return ok


def _sdpa_mask(attn: torch.Tensor) -> torch.Tensor:
    """A decode step's prepared mask: the 2D mask as (rows, 1, 1, columns) booleans, True = attend."""
    return attn[:, None, None, :].bool()


def _same_logits_either_mask(model) -> bool:
    """One decode step of a two-row batch, one row left-padded, with transformers' mask and with the
    prepared one: whether the logits are bit-identical."""
    if preallocated_cache(model, 4) is None:
        return False
    logits = []
    try:
        device, keyword = model.device, cache_keyword(model)
        ids = torch.tensor([[1, 2, 3], [4, 5, 6]], device=device) % model.config.vocab_size
        attn = torch.tensor([[0, 1, 1], [1, 1, 1]], device=device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        step = torch.cat([attn, attn.new_ones(2, 1)], dim=-1)
        with torch.inference_mode():
            for mask in (step, _sdpa_mask(step)):
                cache = preallocated_cache(model, 4)
                model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **{keyword: cache})
                out = model(
                    input_ids=ids[:, -1:],
                    attention_mask=mask,
                    position_ids=pos[:, -1:] + 1,
                    use_cache=True,
                    **{keyword: cache},
                )
                logits.append(out.logits[:, -1])
    except Exception:  # a model this probe cannot run, or one that refuses the prepared mask: transformers' own
        return False
    return torch.equal(*logits)


def supports(config, loop: str | None, assistant) -> bool:
    """Whether the compacting loop reproduces generate() for this configuration."""
    if loop is not None or assistant is not None or config.num_beams != 1 or config.do_sample:
        return False
    if getattr(config, "cache_implementation", None) not in (None, "dynamic"):
        return False
    return only_modifiers(config)


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


def cache_keyword(model) -> str:
    # transformers >= 5.2x names the KV cache `cache`; earlier releases `past_key_values`
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def last_logits_only(model) -> dict:
    """The forward keyword that computes the logits of the last position only, where the model has it."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


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
    """What every step of one decode call uses; rows and their KV cache are passed along."""

    model: object
    clock: object
    processors: object  # RowModifiers: (rows, scores) -> scores
    warpers: object
    sampler: object
    stop: object
    eos: list[int]
    pad: int | None
    max_new: int
    tokens: torch.Tensor  # (queue rows, max_new + 1): the output, one spare column for finished rows
    timeline: Timeline
    cache_kw: str = "cache"
    extra: dict | None = None
    mask4d: bool = False  # decode steps pass the prepared 4D mask (`prepared_mask`, with the preallocated cache)
    every: int = 1  # steps between checks

    @property
    def spare(self) -> int:
        """KV columns a step needs beyond this loop's one per token (a loop whose step writes more)."""
        return 0

    @property
    def rows_each(self) -> int:
        """Rows one prompt occupies (beam search: its beams)."""
        return 1

    def finish(self, rows: Rows) -> Finished:
        """Each queued prompt's end, once the loop is over (a loop that picks its outputs at the end
        writes them here)."""
        return Finished(rows.n_new.tolist(), rows.at_eos.tolist())

    def prefill(self, rows: Rows, prealloc, **more):
        """The rows' prompts through the model into `prealloc` (or transformers' cache): (output, cache)."""
        pos = (rows.attn.cumsum(-1) - 1).clamp(min=0)
        first = {self.cache_kw: prealloc} if prealloc is not None else {}
        out = self.model(
            input_ids=rows.ids,
            attention_mask=rows.attn,
            position_ids=pos,
            use_cache=True,
            **self.extra,
            **first,
            **more,
        )
        return out, getattr(out, self.cache_kw)

    def forward(self, rows: Rows, cache):
        kwargs = {self.cache_kw: cache}
        mask = _sdpa_mask(rows.attn) if self.mask4d else rows.attn
        out = self.model(
            input_ids=rows.ids[:, -1:], attention_mask=mask, position_ids=rows.pos, use_cache=True, **kwargs
        )
        return out, getattr(out, self.cache_kw)

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
        while refill.slots - rows.live.numel() // self.rows_each >= max(1, refill.slots // 4):
            if not self.admit(refill, rows, cache, steps):
                return

    def admit(self, refill: Refill, rows: Rows, cache, steps: int) -> bool:
        """Prefill the next prompts into the free rows, pick their first tokens, merge those that go on
        into `rows` and the stream's KV buffers: False when the queue is empty.

        `steps`: the loop steps so far; the newcomers' second tokens come from the next one."""
        got = refill.next(refill.slots - rows.live.numel() // self.rows_each)
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
        self.timeline.started(range(first, first + enc["input_ids"].shape[0]), mark, self.clock.mark(), steps)
        refill.admissions += 1
        going = new.unfinished.nonzero().squeeze(1)  # not those that ended at once (EOS, a stop, max_new 1)
        if going.numel() < new.live.numel():
            new.keep(going, new_cache, None)
        if going.numel():
            rows.merge(new, cache, new_cache, self.sampler)
        elif self.sampler is not None:
            self.sampler.rows = rows.live
        return True


def decode(
    model,
    enc,
    config,
    *,
    clock,
    processors,
    warpers,
    sampler,
    stop,
    eos,
    check_every: int,
    refill: Refill | None = None,
    step=None,
    step_params: dict | None = None,
) -> DecodeOutput:
    """Greedy search (sampler None) or seeded sampling, compacting as rows finish (and refilling them);
    `step`: a Loop subclass whose steps pick tokens otherwise (contrastive search), with `step_params`."""
    max_new = config.max_new_tokens
    total = refill.total if refill is not None else enc["input_ids"].shape[0]
    rows = Rows(enc["input_ids"], enc["attention_mask"], eos, config.pad_token_id, max_new, total=total)
    parts = (clock, processors, warpers, sampler, stop, eos, config.pad_token_id, max_new)
    loop = _new_loop(step or Loop, model, parts, rows, total, check_every, step_params or {})
    prealloc = _buffers(model, rows, max_new, refill, check_every, loop)
    if refill is not None and prealloc is None:
        raise ValueError("continuous refill needs the preallocated KV cache")
    loop.mask4d = prealloc is not None and prepared_mask(model)
    if sampler is not None:
        sampler.rows = rows.live  # the sampler's seeds are the queue's; the live rows are its first
    steps = compactions = 0
    with torch.inference_mode():
        out, cache = loop.prefill(rows, prealloc)
        while True:
            loop.advance(out, rows)
            if steps == 0:
                loop.timeline.started(range(enc["input_ids"].shape[0]), 0, clock.mark(), 1)
            steps += 1
            if refill is None and steps == max_new:
                break
            if steps % check_every == 0 or steps == 1:  # and after the first token: rows that end at once go
                compactions += loop.check(rows, cache, refill, steps)
                if rows.live.numel() == 0:
                    break
            out, cache = loop.forward(rows, cache)
    return _output(loop, rows, steps, compactions, prealloc is not None, refill)


def _new_loop(kind, model, parts: tuple, rows: Rows, total: int, every: int, params: dict) -> Loop:
    """The loop of one decode call: its parts (ending with max_new), an output row per queued prompt
    (max_new + 1 columns: one spare for finished rows), the model's keywords."""
    tokens = torch.full((total, parts[-1] + 1), rows.pad, dtype=torch.long, device=rows.ids.device)
    keywords = (cache_keyword(model), last_logits_only(model))
    return kind(model, *parts, tokens, Timeline(total), *keywords, every=every, **params)


def _buffers(model, rows: Rows, max_new: int, refill: Refill | None, every: int, loop: Loop):
    """The preallocated KV cache of a batch (prompt + max_new columns) or of a stream (its slots and
    stream_span columns), each with the loop's spare columns and its rows per prompt; None where the
    model's layers are not plain."""
    if refill is None:
        return preallocated_cache(model, rows.width + max_new + loop.spare, rows=rows.live.numel() * loop.rows_each)
    span = stream_span(max(refill.longest, rows.width), max_new, every) + loop.spare
    return preallocated_cache(model, span, rows=refill.slots * loop.rows_each)


def _output(loop: Loop, rows: Rows, steps: int, compactions: int, preallocated: bool, refill) -> DecodeOutput:
    finished = loop.finish(rows)
    kind = "preallocated" if preallocated else "dynamic"
    width = loop.max_new if refill is not None else steps
    admissions = refill.admissions if refill is not None else None
    return DecodeOutput(loop.tokens[:, :width].cpu(), finished, steps, compactions, kind, loop.timeline, admissions)


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
