"""The token choice of the engine's decode loop: from a step's logits to each live row's next token.

`Rules` is what every choice of a job obeys, built once from the plan (worker.engine.plan): the
penalties and minimum length applied to each row's own tokens (worker.engine.modifiers),
transformers' warpers of a sampling strategy, the stop strings and what ends a row
(`rows.Ends`). `Chooser` is greedy search's and sampling's choice over those rules for one decode
call (the plan makes it: `Plan.chooser(sampler, prompts, device)`): it holds the call's seeded sampler and the
output row of every queued generation, and `advance` appends a step's tokens. A strategy of its
own writes `choose` only (worker.engine.custom.TokenStep); one that moves rows or runs the model
its own way (beam search's beams, contrastive search's candidates: worker.engine.loops) overrides
`prefilled`, `forward_of`, `advance` or `finish` as well. The loop that schedules the rows is
worker.engine.decode; the model call, worker.engine.call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from transformers import LogitsProcessorList

from worker.engine.modifiers import RowModifiers
from worker.engine.rows import Ends, Rows
from worker.engine.sampling import SeededSampler, build_warpers
from worker.engine.stops import StopStrings


class Rules(NamedTuple):
    """What every token choice of a job obeys, built once from its plan (`rules`)."""

    processors: RowModifiers  # the penalties and minimum length, each row's own
    warpers: LogitsProcessorList | None  # a sampling strategy's transformers warpers (None: it does not sample)
    stop: StopStrings | None
    ends: Ends  # EOS ids, pad, max_new_tokens


def rules(config, sampler: Mapping[str, Any] | None, stop: tuple[str, ...], tokenizer, device) -> Rules:
    """The rules of a generation config, its seeded sampler's settings and stop strings, on `device`."""
    ends = Ends(eos_ids(config), config.pad_token_id, config.max_new_tokens)
    warpers = LogitsProcessorList(build_warpers(sampler, device)) if sampler is not None else None
    return Rules(RowModifiers(config), warpers, StopStrings(tokenizer, list(stop)) if stop else None, ends)


def eos_ids(config) -> list[int]:
    """A generation config's EOS ids as a list."""
    eos = config.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


@dataclass
class Chooser:
    """Greedy search's and sampling's token choice for one decode call; a subclass's own parameters are
    fields with defaults, filled from the strategy's (`options`)."""

    rules: Rules
    sampler: SeededSampler | None  # the call's seeded draws (sampling), its `rows` kept to the live rows
    tokens: torch.Tensor  # (queued generations, max_new + 1): the output, one spare column for finished rows
    samples: int = 1  # generations per prompt: its row is prefilled once, then repeated (sampling)

    def __post_init__(self) -> None:
        self.processors, self.warpers, self.stop = self.rules.processors, self.rules.warpers, self.rules.stop
        self.ends = self.rules.ends

    @classmethod
    def options(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """The chooser's own fields from the strategy's parameters (none for greedy search and sampling)."""
        return {}

    @property
    def total(self) -> int:
        """Generations in the job's queue (per-generation state: a tensor this long, indexed by rows.live)."""
        return self.tokens.shape[0]

    @property
    def spare(self) -> int:
        """KV columns a step needs beyond the one per token (a chooser that writes more)."""
        return 0

    @property
    def rows_each(self) -> int:
        """Rows one prompt occupies (its samples; beam search: its beams)."""
        return self.samples

    prefill_options: ClassVar[Mapping[str, Any]] = {}  # what the prefill asks of the model besides the logits
    # a chooser whose own `forward_of` still runs the model through the model call (`call.forward`, or
    # `call.candidates`: contrastive search) sets it, so that the plan may give it the static step and CUDA graphs
    # (worker.engine.graphs); one that does not override `forward_of` has them anyway
    own_pass_through_call: ClassVar[bool] = False

    def prefilled(self, call, out, rows: Rows, cache):
        """What the loop's first `advance` takes from the prefill's output (beam search: rows made beams);
        `call`: the loop's model call (worker.engine.call.ModelCall)."""
        return out

    def forward_of(self, call):
        """The pass of a decode step, `(rows, cache) -> (output, cache)`: the model call's forward (contrastive
        search: its candidates)."""
        return call.forward

    def advance(self, out, rows: Rows, cache) -> None:
        """Each live row's next token from the step's logits (`choose`), appended to the rows and the output."""
        scores = out.logits[:, -1].to(dtype=torch.float32, copy=True)
        scores = self.processors(rows, scores)
        if self.warpers is not None:
            scores = self.warpers(rows.ids, scores)
        nxt, column = rows.advance(self.choose(scores, rows), scores, self.stop)
        self.tokens[rows.live, column] = nxt

    def choose(self, scores: torch.Tensor, rows: Rows) -> torch.Tensor:
        """Each live row's token, (live rows,) long, from its float32 scores (live rows, vocabulary), which
        arrive with the penalties, the minimum length and a sampling strategy's warpers applied: the
        most likely, or the seeded draw."""
        return scores.argmax(dim=-1) if self.sampler is None else self.sampler.pick(scores, rows.steps)

    def finish(self, rows: Rows) -> Finished:
        """Each queued generation's end, once the loop is over (a chooser that picks its outputs at the end,
        beam search, writes them here)."""
        return Finished(rows.n_new.tolist(), rows.at_eos.tolist())


@dataclass
class Finished:
    """Per queued generation: new tokens when it finished (-1: ran to the end) and whether at EOS."""

    n_new: list[int]
    at_eos: list[bool]
    steps: list[int] | None = None  # per row, the loop steps it took where that differs from n_new (beams)

    @property
    def timed(self) -> list[int]:
        """Per row, the tokens up to its finish as the clock sees it (its end's loop step)."""
        return self.steps if self.steps is not None else self.n_new
