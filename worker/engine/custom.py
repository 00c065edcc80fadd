"""A strategy's own token choice (`Kind.CUSTOM`, a plugin's): the class a researcher subclasses, and how
the plan finds it (docs/sweeps.md, "Write your own strategy").

`TokenStep` is the decode loop's token chooser (worker.engine.choose.Chooser) with one method left to
write, `choose(scores, rows)`: each live row's next token from its scores, which arrive with the
penalties and minimum length applied (each row's own) and, for a strategy whose `to_config` samples,
after transformers' warpers of that config (temperature, ...). Everything else is the loop's and the
model call's: the prefill, the KV cache, compaction of finished rows, continuous refill, stop strings,
the step clock and each row's timeline, so a plugin's strategy has every metric and timing a built-in
one has. Its own parameters are dataclass fields with defaults, filled from the strategy's (`options`).
A choice that needs more (several rows per prompt, extra KV columns, its own forward pass) subclasses
`Chooser` itself and overrides what it needs, as contrastive and beam search do (worker.engine.loops).

Rows come and go (compaction, refill): `rows.live` holds each live row's place in the job's queue of
generations, so state a chooser carries per generation lives in a tensor of `total` entries indexed by
`rows.live`, and moves with nothing. `draw` is the seeded draw every sampling strategy uses: a
generation's tokens depend on its seed and prompt, never on the rows beside it.

`step_class(strategy)` imports the chooser a `Kind.CUSTOM` strategy names ("module:Class" in the
installed package that declares it; never from sweep input) and checks that it is a `Chooser`.
"""

from __future__ import annotations

import importlib
from functools import cache

import torch

from worker.core.errors import PermanentJobError
from worker.engine.choose import Chooser
from worker.engine.rows import Rows
from worker.strategies import Strategy


class TokenStep(Chooser):
    """One token per row and step, chosen by `choose`; subclass it and write `choose`."""

    def choose(self, scores: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Each live row's token, (live rows,) long, from its float32 scores (live rows, vocabulary)."""
        raise NotImplementedError(f"{type(self).__name__} must define choose(scores, rows)")

    def draw(self, scores: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Each live row's seeded draw from softmax(scores) (-inf: excluded): inverse-CDF with the uniform
        of its generation's (seed, step), as every sampling strategy draws (worker.engine.sampling)."""
        if self.sampler is None:
            raise PermanentJobError(
                f"{type(self).__name__} draws, but its strategy's to_config does not sample (set do_sample: true)"
            )
        return self.sampler.pick(scores, rows.steps)


def step_class(strategy: Strategy) -> type[Chooser]:
    """The chooser a Kind.CUSTOM strategy names, imported from its installed package."""
    return _load(strategy.name, strategy.step)


@cache
def _load(strategy: str, ref: str) -> type[Chooser]:
    module, _, name = ref.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except Exception as err:  # a missing module or class, or a module that fails as it runs: the same on every retry
        why = str(err) if isinstance(err, (ImportError, AttributeError)) else f"{type(err).__name__}: {err}"
        raise PermanentJobError(f"strategy {strategy}: its step {ref} cannot be loaded: {why}") from None
    if not (isinstance(found, type) and issubclass(found, Chooser)):
        raise PermanentJobError(f"strategy {strategy}: its step {ref} is not a worker.engine.choose.Chooser")
    return found
