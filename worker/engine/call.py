"""The model call of the engine's decode loop: a prefill and one forward step over the plan's KV cache.

`ModelCall` is what the decode loop (worker.engine.decode) and the batch-size probe
(worker.engine.batching.probe_step) both run the model with, so that the probe holds what the
loop holds: the model's KV-cache keyword and whether it computes the last position's logits only
(asked once per model: worker.engine.models.probes), the plan's prepared 4D mask for the decode
steps, and the plan's cache (kvcache's preallocated buffers, else transformers' own, which the
model makes at the prefill). It chooses no token and schedules nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.engine.kvcache import preallocated_cache
from worker.engine.models import probes, sdpa_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from worker.engine.rows import Rows


@dataclass(frozen=True)
class ModelCall:
    """How the loop runs the model: `prefill` the rows' prompts, `forward` their last tokens."""

    model: PreTrainedModel
    keyword: str  # the model's KV-cache keyword (models.probes)
    last_logits: bool  # the model takes `logits_to_keep`: a prefill computes the last position's logits only
    mask: bool  # decode steps pass SDPA the prepared 4D mask (the plan's, with the preallocated cache)
    preallocated: bool  # the plan's cache: kvcache's preallocated buffers, else transformers' own

    @classmethod
    def of(cls, model: PreTrainedModel, *, mask: bool, preallocated: bool) -> ModelCall:
        """The call of a model with the plan's mask and cache (worker.engine.plan.Plan.call)."""
        found = probes(model)
        return cls(model, found.cache_keyword, found.last_logits, mask, preallocated)

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
        """Each row's last token through the model over its KV cache: (output, cache)."""
        mask = sdpa_mask(rows.attn) if self.mask else rows.attn
        out = self.model(
            input_ids=rows.ids[:, -1:],
            attention_mask=mask,
            position_ids=rows.pos,
            use_cache=True,
            **{self.keyword: cache},
        )
        return out, getattr(out, self.keyword)
