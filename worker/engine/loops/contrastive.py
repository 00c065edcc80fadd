"""Contrastive search: its step of the decode loop and its batch search (`worker.strategies.contrastive`
has the method).

One forward pass of the B*k candidate tokens per step. The original implementation (and
this loop's fallback, `_repeated`) repeats the KV cache k times, runs B*k rows of one
token each, and selects the winners' rows back: every step copies the whole cache k
times, and attention reads it k times. Where the model takes a prepared 4D mask and the
preallocated cache (`models.prepared_mask`, asked once by the plan), `_shared` runs the k candidates of a row as
k tokens of that row instead, all at the same position, each seeing the row's past and
itself only (a diagonal block in the mask): the cache is read once per row and never
copied, and the winner's keys and values are moved into place afterwards
(`kvcache.keep_candidate`). The logits and hidden states are the same up to float
rounding (the tests compare tokens with the repeated path and with a cache-free
implementation written from the paper).

Where `_shared` applies and no processor beyond the penalties is set (`runs_in_decode_loop`),
contrastive search runs as `ContrastiveStep`, a step of the engine's decode loop
(worker.engine.decode): compaction, continuous refill and per-row penalties come from there, and
`generate`, the batch search, serves the other models and configurations (worker.engine.plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from worker.engine.decode import Step
from worker.engine.kvcache import keep_candidate, preallocated_cache
from worker.engine.models import cache_keyword
from worker.engine.modifiers import only_modifiers


def generate(model, enc, config, params, processors, criteria, check_every: int = 1, mask: bool = False):
    """Run contrastive search; returns the (batch, prompt + new) token ids like generate().

    Finished rows leave the candidate pass (cache, context and mask keep the live rows) at the
    checks, every `check_every` steps (a host synchronisation each: every 8 on CUDA); between
    them a finished row runs on, cut later at its recorded end, changing no other row. The
    processors and stopping criteria see the whole batch (rows that left get pad tokens). `mask`: the
    model takes the prepared mask (the plan's), so the candidates are tokens of their row (`_shared`)."""
    k, alpha = params["k"], params["alpha"]
    cache_kw = cache_keyword(model)  # `cache` in transformers >= 5.2x, `past_key_values` before
    input_ids, attn = enc["input_ids"], enc["attention_mask"]
    batch = input_ids.shape[0]
    pad = config.pad_token_id
    live = torch.arange(batch, device=input_ids.device)  # the batch rows still decoding

    # candidates as tokens of their row, over the preallocated cache, where the model takes the prepared mask
    first = {cache_kw: preallocated_cache(model, input_ids.shape[1] + config.max_new_tokens + k)} if mask else {}
    candidates, choose = (_shared, keep_candidate) if mask else (_repeated, _keep_repeated)

    with torch.inference_mode():
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=input_ids,
            attention_mask=attn,
            position_ids=pos,
            use_cache=True,
            output_hidden_states=True,
            **first,
        )
        past = getattr(out, cache_kw)
        context = _Context(out.hidden_states[-1], attn.bool(), config.max_new_tokens)  # (live, T, D) and growing
        logits = out.logits[:, -1, :]  # (batch, vocab): a finished row keeps its last, unused
        unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
        for step in range(1, config.max_new_tokens + 1):
            scores = processors(input_ids, logits.float())
            top_p, top_ids = torch.softmax(scores[live], dim=-1).topk(k, dim=-1)  # (live, k)
            n = live.numel()
            rows = torch.arange(n, device=live.device)

            past, cand_logits, hidden = candidates(model, cache_kw, past, attn, top_ids)  # (live, k, .)
            best = _best(hidden, *context.view(), top_p, alpha)  # (live,)
            choose(past, best, k)
            logits = logits.index_copy(0, live, cand_logits[rows, best].to(logits.dtype))
            next_tokens = torch.full((batch,), pad, dtype=input_ids.dtype, device=input_ids.device)
            next_tokens[live] = top_ids[rows, best]
            context.append(hidden[rows, best])
            attn = torch.cat([attn, attn.new_ones(n, 1)], dim=-1)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            unfinished &= ~criteria(input_ids, scores)
            if step % check_every:
                continue
            keep = unfinished[live]
            if not bool(keep.all()):  # rows finished: they leave the candidate pass
                if not bool(keep.any()):
                    break
                kept = keep.nonzero().squeeze(1)
                live, attn = live[kept], attn[kept]
                context.keep(kept)
                past.batch_select_indices(kept)
    return input_ids


def _repeated(model, cache_kw: str, past, attn, top_ids):
    """One forward pass of every live row's k candidates over its cache repeated k times:
    (the cache, the candidates' logits (live, k, V) and last hidden states (live, k, D))."""
    n, k = top_ids.shape
    past.batch_repeat_interleave(k)
    cand_attn = torch.cat([attn, attn.new_ones(n, 1)], dim=-1).repeat_interleave(k, dim=0)
    cand_pos = attn.sum(-1, keepdim=True).repeat_interleave(k, dim=0)
    cand = model(
        input_ids=top_ids.reshape(-1, 1),
        attention_mask=cand_attn,
        position_ids=cand_pos,
        use_cache=True,
        output_hidden_states=True,
        **{cache_kw: past},
    )
    hidden = cand.hidden_states[-1][:, -1, :].reshape(n, k, -1)
    return getattr(cand, cache_kw), cand.logits[:, -1, :].reshape(n, k, -1), hidden


def _keep_repeated(past, best, k: int) -> None:
    """Each row's winning copy of the repeated cache."""
    past.batch_select_indices(torch.arange(best.shape[0], device=best.device) * k + best)


def _shared(model, cache_kw: str, past, attn, top_ids):
    """One forward pass of every live row's k candidates as k tokens of the row, all at its next
    position, each attending to the row's past and to itself only: as `_repeated`, without copies."""
    n, k = top_ids.shape
    own = torch.eye(k, dtype=torch.bool, device=attn.device)[None, None].expand(n, 1, k, k)
    mask = torch.cat([attn.bool()[:, None, None, :].expand(n, 1, k, attn.shape[1]), own], dim=-1)
    cand = model(
        input_ids=top_ids,
        attention_mask=mask,
        position_ids=attn.sum(-1, keepdim=True).expand(n, k),
        use_cache=True,
        output_hidden_states=True,
        **{cache_kw: past},
    )
    return getattr(cand, cache_kw), cand.logits, cand.hidden_states[-1]


class _Context:
    """The live rows' hidden states so far (the degeneration penalty's context) and their mask, in
    buffers of the final length written one column per step: no copy of the whole context per token."""

    def __init__(self, hidden: torch.Tensor, mask: torch.Tensor, max_new: int) -> None:
        rows, self.length, dim = hidden.shape
        self.hidden = hidden.new_empty(rows, self.length + max_new, dim)
        self.mask = mask.new_ones(rows, self.length + max_new)
        self.hidden[:, : self.length], self.mask[:, : self.length] = hidden, mask

    def view(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.hidden[:, : self.length], self.mask[:, : self.length]

    def append(self, hidden: torch.Tensor) -> None:
        self.hidden[:, self.length] = hidden
        self.length += 1

    def keep(self, rows: torch.Tensor) -> None:
        self.hidden, self.mask = self.hidden[rows], self.mask[rows]


def _best(hidden, context, context_mask, top_p, alpha: float):
    """Each row's winner: (1 - alpha) p(v) - alpha max_j cos(h_v, h_j) over its context."""
    sim = torch.einsum(
        "bkd,btd->bkt",
        torch.nn.functional.normalize(hidden.float(), dim=-1),
        torch.nn.functional.normalize(context.float(), dim=-1),
    ).masked_fill(~context_mask[:, None, :], -float("inf"))
    penalty = sim.max(dim=-1).values  # (live, k)
    return ((1 - alpha) * top_p - alpha * penalty).argmax(dim=-1)


def runs_in_decode_loop(config, mask: bool) -> bool:
    """Whether contrastive search can run as a step of the engine's decode loop (worker.engine.decode:
    compaction, continuous refill, per-row penalties): where the candidates share their row's cache
    (`mask`: the model takes the prepared mask, with the preallocated cache) and no processor beyond
    the penalties is set."""
    return config.num_beams == 1 and not config.do_sample and only_modifiers(config) and mask


class _Picked(NamedTuple):
    tokens: torch.Tensor  # (rows,) each row's winner
    hidden: torch.Tensor  # (rows, D) its last hidden state: the row's context from now on
    scores: torch.Tensor  # (rows, V) the processed scores it was chosen from


@dataclass
class ContrastiveStep(Step):
    """Contrastive search as the step of the engine's decode loop: every step is one pass of each live
    row's k candidates over the row's own cache (`_shared`), its winner's keys and values kept in
    place. The rows carry the logits of their last token (`Rows.carry`) and the hidden states of
    their columns (`Rows.context`, the degeneration penalty's context), so that compaction and
    refill move them with the rows. Unlike the greedy loop's, a row's last token is already in the
    cache after a step (the winner's column): the stream's buffers hold `spare` = k more columns."""

    k: int = 4
    alpha: float = 0.6

    describe: ClassVar[str | None] = "contrastive search's step (worker.engine.loops.contrastive)"

    @classmethod
    def options(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"k": int(params["k"]), "alpha": float(params["alpha"])}

    @property
    def spare(self) -> int:
        return self.k

    def prefill(self, rows, prealloc):
        """The prompts (their hidden states are the rows' first context), then the first candidate pass."""
        out, cache = super().prefill(rows, prealloc, output_hidden_states=True)
        rows.set_context(out.hidden_states[-1])
        rows.carry = out.logits[:, -1]
        return self._candidates(rows, cache), cache

    def forward(self, rows, cache):
        return self._candidates(rows, cache), cache

    def _candidates(self, rows, cache) -> _Picked:
        scores = self.processors(rows, rows.carry.to(dtype=torch.float32, copy=True))
        top_p, top_ids = torch.softmax(scores, dim=-1).topk(self.k, dim=-1)
        cache, logits, hidden = _shared(self.model, self.cache_keyword, cache, rows.attn, top_ids)
        best = _best(hidden, rows.context, rows.attn.bool(), top_p, self.alpha)
        keep_candidate(cache, best, self.k)
        n = torch.arange(best.shape[0], device=best.device)
        rows.carry = logits[n, best]
        return _Picked(top_ids[n, best], hidden[n, best], scores)

    def advance(self, out: _Picked, rows, clocked: bool = True) -> None:
        """Append each live row's winner and its hidden state (the clock stamps a loop step)."""
        if clocked:
            self.clock(rows.ids, out.scores)
        nxt, column = rows.advance(out.tokens, out.scores, self.stop)
        self.tokens[rows.live, column] = nxt
        rows.set_last_context(out.hidden)
