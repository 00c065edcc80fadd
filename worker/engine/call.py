"""The model call of the engine's decode loop: a prefill and one forward step over the plan's KV cache.

`ModelCall` is what the decode loop (worker.engine.decode) and the batch-size probe
(worker.engine.batching.probe_step) both run the model with, so that the probe holds what the
loop holds: the model's KV-cache keyword and whether it computes the last position's logits only
(asked once per model: worker.engine.models.probes), the plan's prepared 4D mask for the decode
steps, and the plan's cache (kvcache's preallocated buffers, else transformers' own, which the
model makes at the prefill). It chooses no token and schedules nothing.

Its decode forward is the plan's decode step (`step`): the eager one (`eager_forward`: a view of each
layer's window and the rows' mask), or the static, bucketed one over the preallocated buffers
(worker.engine.graphs), run eagerly (`static`) or captured as CUDA graphs (`graphs`), one per cache
(a batch's or a stream's buffers); `step_stats` sums what those did.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from worker.engine.graphs import DecodeStep, StaticStep, StepStats
from worker.engine.kvcache import is_preallocated, preallocated_cache
from worker.engine.models import probes, sdpa_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from worker.engine.rows import Rows
    from worker.engine.timing import StepClock


@dataclass(frozen=True)
class ModelCall:
    """How the loop runs the model: `prefill` the rows' prompts, `forward` their last tokens."""

    model: PreTrainedModel
    keyword: str  # the model's KV-cache keyword (models.probes)
    last_logits: bool  # the model takes `logits_to_keep`: a prefill computes the last position's logits only
    mask: bool  # decode steps pass SDPA the prepared 4D mask (the plan's, with the preallocated cache)
    preallocated: bool  # the plan's cache: kvcache's preallocated buffers, else transformers' own
    step: DecodeStep = DecodeStep.EAGER  # the plan's decode step
    clock: StepClock | None = None  # the decode call's clock, paused while a graph is captured
    # the static step of each cache this call has stepped, for as long as the cache lives
    _static: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        model: PreTrainedModel,
        *,
        mask: bool,
        preallocated: bool,
        step: DecodeStep = DecodeStep.EAGER,
        clock: StepClock | None = None,
    ) -> ModelCall:
        """The call of a model with the plan's mask, cache and decode step (worker.engine.plan.Plan.call), timed by
        `clock`."""
        found = probes(model)
        return cls(model, found.cache_keyword, found.last_logits, mask, preallocated, step, clock)

    def buffers(self, columns: int, rows: int):
        """Preallocated KV buffers of `rows` rows and `columns` columns; None over transformers' own cache."""
        return preallocated_cache(self.model, columns, rows=rows) if self.preallocated else None

    def prefill(self, rows: Rows, cache, **more: Any):
        """The rows' prompts through the model into `cache` (None: transformers makes its own): (output, cache)."""
        pos = (rows.attn.cumsum(-1) - 1).clamp(min=0)
        if self.last_logits:
            more = {"logits_to_keep": 1, **more}
        if cache is not None:
            more = {self.keyword: cache, **more}
        out = self.model(input_ids=rows.ids, attention_mask=rows.attn, position_ids=pos, use_cache=True, **more)
        return out, getattr(out, self.keyword)

    def forward(self, rows: Rows, cache):
        """Each row's last token through the model over its KV cache, by the plan's decode step: (output, cache)."""
        static = self._static_of(cache)
        if static is not None:
            return static(rows, cache, self.eager_forward)
        return self.eager_forward(rows, cache)

    def _static_of(self, cache) -> StaticStep | None:
        """The static step over this cache, where the plan's decode step is one and the cache is preallocated."""
        if self.step is DecodeStep.EAGER or cache is None:
            return None
        static = self._static.get(cache)
        if static is None and is_preallocated(cache):
            pause = self.clock.paused if self.clock is not None else nullcontext
            static = self._static[cache] = StaticStep(
                self.model, self.keyword, graphs=self.step is DecodeStep.GRAPHS, pause=pause
            )
        return static

    def candidates(self, cache, attn, top_ids):
        """Contrastive search's pass over its rows' own cache (the prepared mask): every live row's k candidates as
        k tokens of the row, all at its next position, each attending to the row's past (`attn`) and to itself
        only, by the plan's decode step: (logits (n, k, V), last hidden states (n, k, D))."""
        static = self._static_of(cache)
        if static is not None:
            return static.candidates(cache, attn, top_ids, lambda: self.eager_candidates(cache, attn, top_ids))
        return self.eager_candidates(cache, attn, top_ids)

    def eager_candidates(self, cache, attn, top_ids):
        """`candidates` over the cache's window: the 4D mask of the rows' past and a diagonal block of their own."""
        n, k = top_ids.shape
        own = torch.eye(k, dtype=torch.bool, device=attn.device)[None, None].expand(n, 1, k, k)
        mask = torch.cat([attn.bool()[:, None, None, :].expand(n, 1, k, attn.shape[1]), own], dim=-1)
        out = self.model(
            input_ids=top_ids,
            attention_mask=mask,
            position_ids=attn.sum(-1, keepdim=True).expand(n, k),
            use_cache=True,
            output_hidden_states=True,
            **{self.keyword: cache},
        )
        return out.logits, out.hidden_states[-1]

    def step_stats(self) -> StepStats | None:
        """What this call's static steps did (None: the eager step ran every step)."""
        if not self._static:
            return None
        total = StepStats()
        for static in list(self._static.values()):
            total.add(static.stats)
        return total

    def eager_forward(self, rows: Rows, cache):
        """Each row's last token through the model over its KV cache's window: (output, cache)."""
        mask = sdpa_mask(rows.attn) if self.mask else rows.attn
        out = self.model(
            input_ids=rows.ids[:, -1:],
            attention_mask=mask,
            position_ids=rows.pos,
            use_cache=True,
            **{self.keyword: cache},
        )
        return out, getattr(out, self.keyword)
