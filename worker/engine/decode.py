"""The engine's own decoding loop for greedy and sampling: rows that finish stop costing compute.

`decode(...)` runs one left-padded batch like transformers' generate() does for greedy
search and sampling (prefill with the last position's logits only, then one token per
step over a KV cache, positions from the attention mask), with decodebench's pieces
plugged in: the step clock, the penalty processors, transformers' warpers and the
vectorised seeded sampler. What it adds is **compaction**: at a check every
`check_every` steps (every step on CPU, where a check costs nothing; every 8 on CUDA,
so that there is no host synchronisation per token) the rows that have finished (EOS or
a stop string) are dropped from the batch: from the token ids, the attention mask and
every layer of the KV cache. The remaining rows compute exactly what they computed
before, so greedy outputs are those of the unbatched run, and a sampled row draws with
its own (seed, step) uniforms whichever rows remain.

Configurations whose processors the loop does not rebuild (`supports`) keep using
generate().
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from worker.engine.kvcache import preallocated_cache

# GenerationConfig fields that make generate() add processors this loop does not build.
_UNSUPPORTED_IF_SET = (
    "bad_words_ids",
    "begin_suppress_tokens",
    "suppress_tokens",
    "sequence_bias",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "exponential_decay_length_penalty",
    "top_h",
)


def supports(config, loop: str | None, assistant) -> bool:
    """Whether the compacting loop reproduces generate() for this configuration."""
    if loop is not None or assistant is not None or config.num_beams != 1 or config.do_sample:
        return False
    if getattr(config, "cache_implementation", None) not in (None, "dynamic"):
        return False
    if any(getattr(config, name, None) for name in _UNSUPPORTED_IF_SET):
        return False
    if (config.guidance_scale or 1.0) != 1.0 or (config.encoder_repetition_penalty or 1.0) != 1.0:
        return False
    return not (config.min_length or config.encoder_no_repeat_ngram_size or config.remove_invalid_values)


@dataclass
class Finished:
    """Per original row: new tokens when it finished (-1: ran to the end) and whether at EOS."""

    n_new: list[int]
    at_eos: list[bool]


@dataclass
class DecodeOutput:
    tokens: torch.Tensor  # (rows, steps) on the CPU: every token a row was given (cut later at its finish)
    finished: Finished
    steps: int  # decoding steps run (the longest row)
    compactions: int  # times finished rows were dropped from the batch
    kv_cache: str  # "preallocated" (worker.engine.kvcache) or "dynamic" (transformers' own)


def _cache_keyword(model) -> str:
    # transformers >= 5.2x names the KV cache `cache`; earlier releases `past_key_values`
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Rows:
    """The live rows of the batch and their per-step state; `keep` compacts them.

    Token ids and the attention mask live in buffers of the batch's final width (prompt
    + max_new_tokens) and grow by writing a column, not by concatenation; `ids` and
    `attn` are views of the filled part.
    """

    def __init__(self, input_ids, attn, eos, pad, max_new: int):
        batch, width = input_ids.shape
        device = input_ids.device
        self.pad = pad if pad is not None else (eos[0] if eos else 0)
        self._ids = input_ids.new_full((batch, width + max_new), self.pad)
        self._attn = attn.new_ones((batch, width + max_new))
        self._ids[:, :width], self._attn[:, :width] = input_ids, attn
        self.width = width
        self.pos = attn.sum(-1, keepdim=True) - 1  # the position of each row's last token
        self.live = torch.arange(batch, device=device)  # original index of each live row
        self.unfinished = torch.ones(batch, dtype=torch.bool, device=device)
        self.n_new = torch.full((batch,), -1, dtype=torch.long, device=device)
        self.at_eos = torch.zeros(batch, dtype=torch.bool, device=device)
        self.eos = torch.tensor(eos, dtype=torch.long, device=device)

    @property
    def ids(self) -> torch.Tensor:
        return self._ids[:, : self.width]

    @property
    def attn(self) -> torch.Tensor:
        return self._attn[:, : self.width]

    def advance(self, nxt, scores, step: int, stop) -> torch.Tensor:
        """Append this step's tokens (pad for finished rows), mark rows that end here."""
        nxt = torch.where(self.unfinished, nxt, self.pad)
        self._ids[:, self.width] = nxt
        self.width += 1
        self.pos += 1
        is_eos = torch.isin(nxt, self.eos)
        ends = is_eos | stop(self.ids, scores) if stop is not None else is_eos
        newly = ends & self.unfinished
        self.n_new[self.live] = torch.where(newly, step + 1, self.n_new[self.live])
        self.at_eos[self.live] |= newly & is_eos
        self.unfinished &= ~newly
        return nxt

    def keep(self, index, cache, sampler) -> None:
        self._ids, self._attn, self.pos = self._ids[index], self._attn[index], self.pos[index]
        self.live, self.unfinished = self.live[index], self.unfinished[index]
        cache.batch_select_indices(index)
        if sampler is not None:
            sampler.rows = self.live


def decode(model, enc, config, *, clock, processors, warpers, sampler, stop, eos, check_every: int) -> DecodeOutput:
    """Greedy search (sampler None) or seeded sampling on one encoded batch, compacting as rows finish."""
    max_new = config.max_new_tokens
    rows = _Rows(enc["input_ids"], enc["attention_mask"], eos, config.pad_token_id, max_new)
    batch = rows.ids.shape[0]
    tokens = torch.full((batch, max_new), rows.pad, dtype=torch.long, device=rows.ids.device)
    cache_kw = _cache_keyword(model)
    extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    steps = compactions = 0
    with torch.inference_mode():
        pos = (rows.attn.cumsum(-1) - 1).clamp(min=0)
        prealloc = preallocated_cache(model, rows.width + max_new)
        first = {cache_kw: prealloc} if prealloc is not None else {}
        out = model(input_ids=rows.ids, attention_mask=rows.attn, position_ids=pos, use_cache=True, **extra, **first)
        cache = getattr(out, cache_kw)
        for step in range(max_new):
            scores = clock(rows.ids, out.logits[:, -1].to(dtype=torch.float32, copy=True))
            scores = processors(rows.ids, scores)
            if sampler is not None:
                nxt = sampler.pick(warpers(rows.ids, scores), step)
            else:
                nxt = scores.argmax(dim=-1)
            nxt = rows.advance(nxt, scores, step, stop)
            tokens[rows.live, step] = nxt
            steps = step + 1
            if steps == max_new:
                break
            if steps % check_every == 0:
                live = rows.unfinished.nonzero().squeeze(1)  # the check: one synchronisation
                if live.numel() == 0:
                    break
                if live.numel() < rows.live.numel():
                    rows.keep(live, cache, sampler)
                    compactions += 1
            out = model(
                input_ids=rows.ids[:, -1:],
                attention_mask=rows.attn,
                position_ids=rows.pos,
                use_cache=True,
                **{cache_kw: cache},
            )
            cache = getattr(out, cache_kw)
    finished = Finished(rows.n_new.tolist(), rows.at_eos.tolist())
    kind = "dynamic" if prealloc is None else "preallocated"
    return DecodeOutput(tokens[:, :steps].cpu(), finished, steps, compactions, kind)
