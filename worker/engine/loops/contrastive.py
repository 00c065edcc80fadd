"""Contrastive search as a step of the engine's decode loop (`worker.strategies.contrastive` has the method).

One forward pass of the B*k candidate tokens per step. The original implementation (and
this step's fallback, `_repeated`) repeats the KV cache k times, runs B*k rows of one
token each, and selects the winners' rows back: every step copies the whole cache k
times, and attention reads it k times. Where the model takes a prepared 4D mask and the
preallocated cache (`models.prepared_mask`, asked once by the plan), `_shared` runs the k candidates of a row as
k tokens of that row instead, all at the same position, each seeing the row's past and
itself only (a diagonal block in the mask): the cache is read once per row and never
copied, and the winner's keys and values are moved into place afterwards
(`kvcache.keep_candidate`). The logits and hidden states are the same up to float
rounding (the tests compare tokens with the repeated cache and with a cache-free
implementation written from the paper).

`ContrastiveStep` is the token chooser either way (worker.engine.choose; the decode loop,
worker.engine.decode, gives it compaction, per-row penalties and, over the preallocated cache,
continuous refill): its decode step's pass is its candidates' (`forward_of`), through the loop's
model call (worker.engine.call), which share their row's cache where the plan's mask is the
prepared one, and run over transformers' own cache repeated k times elsewhere (worker.engine.plan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, NamedTuple

import torch

from worker.engine.call import ModelCall
from worker.engine.choose import Chooser
from worker.engine.kvcache import keep_candidate


def _repeated(call: ModelCall, past, attn, top_ids):
    """One forward pass of every live row's k candidates over its cache repeated k times:
    (the cache, the candidates' logits (live, k, V) and last hidden states (live, k, D))."""
    n, k = top_ids.shape
    past.batch_repeat_interleave(k)
    cand_attn = torch.cat([attn, attn.new_ones(n, 1)], dim=-1).repeat_interleave(k, dim=0)
    cand_pos = attn.sum(-1, keepdim=True).repeat_interleave(k, dim=0)
    cand = call.model(
        input_ids=top_ids.reshape(-1, 1),
        attention_mask=cand_attn,
        position_ids=cand_pos,
        use_cache=True,
        output_hidden_states=True,
        **{call.keyword: past},
    )
    hidden = cand.hidden_states[-1][:, -1, :].reshape(n, k, -1)
    return getattr(cand, call.keyword), cand.logits[:, -1, :].reshape(n, k, -1), hidden


def _keep_repeated(past, best, k: int) -> None:
    """Each row's winning copy of the repeated cache."""
    past.batch_select_indices(torch.arange(best.shape[0], device=best.device) * k + best)


def _shared(call: ModelCall, past, attn, top_ids):
    """One forward pass of every live row's k candidates as k tokens of the row, all at its next
    position, each attending to the row's past and to itself only: as `_repeated`, without copies
    (the model call's `candidates`: eager, or its static step)."""
    logits, hidden = call.candidates(past, attn, top_ids)
    return past, logits, hidden


def _best(hidden, context, context_mask, top_p, alpha: float):
    """Each row's winner: (1 - alpha) p(v) - alpha max_j cos(h_v, h_j) over its context."""
    sim = torch.einsum(
        "bkd,btd->bkt",
        torch.nn.functional.normalize(hidden.float(), dim=-1),
        torch.nn.functional.normalize(context.float(), dim=-1),
    ).masked_fill(~context_mask[:, None, :], -float("inf"))
    penalty = sim.max(dim=-1).values  # (live, k)
    return ((1 - alpha) * top_p - alpha * penalty).argmax(dim=-1)


class _Picked(NamedTuple):
    tokens: torch.Tensor  # (rows,) each row's winner
    hidden: torch.Tensor  # (rows, D) its last hidden state: the row's context from now on
    scores: torch.Tensor  # (rows, V) the processed scores it was chosen from


@dataclass
class ContrastiveStep(Chooser):
    """Contrastive search as the token chooser of the engine's decode loop: every step is one pass of each
    live row's k candidates over the row's own cache (`_shared`, with the prepared mask), its winner's
    keys and values kept in place, or, without the prepared mask, over transformers' cache repeated k
    times (`_repeated`), the winners' rows selected back. The rows carry the logits of their last
    token (`Rows.carry`) and the hidden states of their columns (`Rows.context`, the degeneration
    penalty's context), so that compaction and refill move them with the rows. Unlike greedy
    search's, a row's last token is already in the cache after a step (the winner's column): the
    stream's buffers hold `spare` = k more columns."""

    k: int = 4
    alpha: float = 0.6

    prefill_options: ClassVar[Mapping[str, Any]] = {"output_hidden_states": True}  # the rows' first context
    own_pass_through_call: ClassVar[bool] = True  # `_shared` is the model call's `candidates`

    @classmethod
    def options(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"k": int(params["k"]), "alpha": float(params["alpha"])}

    @property
    def spare(self) -> int:
        return self.k

    def prefilled(self, call: ModelCall, out, rows, cache) -> _Picked:
        """The prompts' hidden states are the rows' first context; then the first candidate pass."""
        rows.set_context(out.hidden_states[-1])
        rows.carry = out.logits[:, -1]
        return self._candidates(call, rows, cache)

    def forward_of(self, call: ModelCall):
        return partial(self._step, call)

    def _step(self, call: ModelCall, rows, cache):
        return self._candidates(call, rows, cache), cache

    def _candidates(self, call: ModelCall, rows, cache) -> _Picked:
        scores = self.processors(rows, rows.carry.to(dtype=torch.float32, copy=True))
        top_p, top_ids = torch.softmax(scores, dim=-1).topk(self.k, dim=-1)
        candidates, choose = (_shared, keep_candidate) if call.mask else (_repeated, _keep_repeated)
        cache, logits, hidden = candidates(call, cache, rows.attn, top_ids)
        best = _best(hidden, rows.context, rows.attn.bool(), top_p, self.alpha)
        choose(cache, best, self.k)
        n = torch.arange(best.shape[0], device=best.device)
        rows.carry = logits[n, best]
        return _Picked(top_ids[n, best], hidden[n, best], scores)

    def advance(self, out: _Picked, rows, cache) -> None:
        """Append each live row's winner and its hidden state."""
        nxt, column = rows.advance(out.tokens, out.scores, self.stop)
        self.tokens[rows.live, column] = nxt
        rows.set_last_context(out.hidden)
