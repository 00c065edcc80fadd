"""A strategy's own step (`Kind.CUSTOM`, a plugin's): the class a researcher subclasses, and how the
plan finds it (docs/sweeps.md, "Write your own strategy").

`TokenStep` is the decode loop's `Step` (worker.engine.decode) with one method left to write,
`choose(scores, rows)`: each live row's next token from its scores, which arrive with the penalties
and minimum length applied (each row's own) and, for a strategy whose `to_config` samples, after
transformers' warpers of that config (temperature, ...). Everything else is the loop's: the prefill,
the KV cache, compaction of finished rows, continuous refill, stop strings, the step clock and each
row's timeline, so a plugin's strategy has every metric and timing a built-in one has. A step that
needs more (several rows per prompt, extra KV columns, its own forward pass) subclasses `Step` itself
and overrides what it needs, as contrastive and beam search do.

Rows come and go (compaction, refill): `rows.live` holds each live row's place in the job's queue of
prompts, so state a step carries per generation lives in a tensor of `total` entries indexed by
`rows.live`, and moves with nothing. `draw` is the seeded draw every sampling strategy uses: a
generation's tokens depend on its seed and prompt, never on the rows beside it.

`step_class(strategy)` imports the step a `Kind.CUSTOM` strategy names ("module:Class" in the
installed package that declares it; never from sweep input) and checks that it is a `Step`.
"""

from __future__ import annotations

import importlib
from functools import cache

import torch

from worker.core.errors import PermanentJobError
from worker.engine.decode import Step
from worker.engine.rows import Rows
from worker.strategies import Strategy


class TokenStep(Step):
    """One token per row and step, chosen by `choose`; subclass it and write `choose`."""

    def advance(self, out, rows: Rows, clocked: bool = True) -> None:
        """Pick each live row's next token with `choose` (the clock stamps a loop step), append it."""
        scores = out.logits[:, -1].to(dtype=torch.float32, copy=True)
        scores = self.clock(rows.ids, scores) if clocked else scores
        scores = self.processors(rows, scores)
        if self.warpers is not None:
            scores = self.warpers(rows.ids, scores)
        nxt, column = rows.advance(self.choose(scores, rows), scores, self.stop)
        self.tokens[rows.live, column] = nxt

    def choose(self, scores: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Each live row's token, (live rows,) long, from its float32 scores (live rows, vocabulary)."""
        raise NotImplementedError(f"{type(self).__name__} must define choose(scores, rows)")

    @property
    def total(self) -> int:
        """Rows in the job's queue of prompts (per-generation state: a tensor this long, indexed by rows.live)."""
        return self.tokens.shape[0]

    def draw(self, scores: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Each live row's seeded draw from softmax(scores) (-inf: excluded): inverse-CDF with the uniform
        of its generation's (seed, step), as every sampling strategy draws (worker.engine.sampling)."""
        if self.sampler is None:
            raise PermanentJobError(
                f"{type(self).__name__} draws, but its strategy's to_config does not sample (set do_sample: true)"
            )
        return self.sampler.pick(scores, rows.steps)


def step_class(strategy: Strategy) -> type[Step]:
    """The step a Kind.CUSTOM strategy names, imported from its installed package."""
    return _load(strategy.name, strategy.step)


@cache
def _load(strategy: str, ref: str) -> type[Step]:
    module, _, name = ref.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise PermanentJobError(f"strategy {strategy}: its step {ref} cannot be loaded: {err}") from None
    if not (isinstance(found, type) and issubclass(found, Step)):
        raise PermanentJobError(f"strategy {strategy}: its step {ref} is not a worker.engine.decode.Step")
    return found
