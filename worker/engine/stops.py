"""Where generations end: stop strings checked at the cost of one table lookup wherever that is
exact, and the finish recorder of the loops that run whole batches.

transformers' `StopStringCriteria` matches stop strings on token ids with tensor operations
only (no decoding), which is what a decoding loop needs, but each call is some twenty
small operations over the last tokens of every row: on a GPU, twenty kernel launches per
decoded token, where a small model's whole step is a few hundred.

Its own precomputed table already says, for every token, how much of each stop string's
end the token can overlap (`end_lengths`). A match must overlap the last token, so:

- a last token that overlaps no stop string's end cannot end a match (`maybe` is False);
- a last token that holds a whole stop string (an overlap of its full length) ends one
  on its own (`alone`), whatever came before.

Where every token that may end a match ends one on its own (single-character stop strings
such as ".", "," or "\\n", or any set where that holds), the check is `alone[last token]`:
exact, one gather per step. Otherwise transformers' check runs; on the CPU only when some
row's last token may end a match (there the branch costs no synchronisation). A test runs
both over every token of the vocabulary as the last one, with several stop-string sets.

A stop string is matched in a row's own new tokens only (`own`: how many it has), as vLLM matches
it in the output text and as the record's text is cut: transformers' check, given the whole row,
also matches one that begins in the prompt (a prompt ending "the" with the stop string "the same"
ended at the first token " same", whose text holds no stop string). The columns before a row's new
tokens are handed to the check as an id past its table, its dummy row, which overlaps nothing; a
token that holds a whole stop string is a new token, so the lookup needs no such mask.

`FinishRecorder` is the stopping criterion that records, per row, the step at which it
ended (EOS or a stop string), on the device, read once after the batch.
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteria
from transformers.generation.stopping_criteria import StopStringCriteria


class StopStrings(StoppingCriteria):
    """transformers' StopStringCriteria, answered by a table lookup where that is exact."""

    def __init__(self, tokenizer, stop_strings: list[str]) -> None:
        self.criteria = StopStringCriteria(tokenizer, stop_strings)
        table = self.criteria.embedding_vec  # per token: valid positions | end lengths | token length
        strings, positions = self.criteria.num_stop_strings, self.criteria.max_valid_positions
        ends = table[:, positions * strings : -1].unflatten(-1, (strings, -1))  # (tokens, strings, end lengths)
        self.alone = (ends >= self.criteria.target_lens[None, :, None]).any(-1).any(-1)
        self.maybe = (ends > 0).any(-1).any(-1)
        self.exact = not bool((self.maybe & ~self.alone).any())

    def __call__(self, input_ids: torch.Tensor, scores, own: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """Per row, whether its tokens end with a stop string; `own`: per row, how many of its last tokens are
        its new ones, where a match may lie (None: every column of `input_ids`)."""
        if self.alone.device != input_ids.device:
            device = input_ids.device  # once; not a blocking copy (a host sync) inside the loop
            self.alone, self.maybe = self.alone.to(device, non_blocking=True), self.maybe.to(device, non_blocking=True)
        last = input_ids[:, -1].clamp(max=self.alone.shape[0] - 1)  # out-of-vocabulary ids: the dummy row
        if self.exact:
            return self.alone[last]
        if input_ids.device.type == "cpu" and not bool(self.maybe[last].any()):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)
        return self.criteria(input_ids if own is None else self._own_tail(input_ids, own), scores)

    def _own_tail(self, input_ids: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """The last columns the check reads, those before each row's `own` new tokens made the dummy id."""
        width = min(input_ids.shape[1], self.criteria.maximum_token_len)
        mine = torch.arange(width, device=input_ids.device) >= width - own[:, None]
        return torch.where(mine, input_ids[:, -width:], self.criteria.embedding_vec.shape[0])


class NewTokens(StoppingCriteria):
    """Stop strings as generate()'s criterion over the new tokens only (assisted decoding, whose draft model's
    generate() is handed the main config and refuses its `stop_strings` without a tokenizer). A verification
    step accepts several tokens and this reads the last: a stop string that ends before it is cut on the host
    (worker.engine.generate._finish, `first_holding`)."""

    def __init__(self, stop: StopStrings, prompt_len: int) -> None:
        self.stop, self.prompt_len = stop, prompt_len

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        return self.stop(input_ids[:, self.prompt_len :], scores)


def first_holding(decode, seq: list[int], stops: tuple[str, ...]) -> int:
    """The fewest of `seq`'s tokens whose text holds a stop string (`decode`: token ids -> text), given that the
    whole of `seq`'s does: a binary search, as a prefix's text holds one whenever a shorter prefix's does."""
    lo, hi = 1, len(seq)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if any(s in decode(seq[:mid]) for s in stops) else (mid + 1, hi)
    return hi


class FinishRecorder(StoppingCriteria):
    """Marks a row done at EOS or a stop string and records the step at which it finished.

    The record stays on the device until `finished` is read after the batch (no host
    synchronisation per step): per row, its new tokens at the finish (-1: not yet) and
    whether the finish was EOS."""

    def __init__(self, prompt_len: int, eos_ids: list[int], stop: StopStrings | None, batch: int, device) -> None:
        self.prompt_len = prompt_len
        self.eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
        self.stop = stop
        self._n_new = torch.full((batch,), -1, dtype=torch.long, device=device)
        self._at_eos = torch.zeros(batch, dtype=torch.bool, device=device)
        self._finished: list[tuple[int, str] | None] | None = None

    def __call__(self, input_ids, scores, **kwargs):
        is_eos = torch.isin(input_ids[:, -1], self.eos)
        ends = is_eos | self.stop(input_ids[:, self.prompt_len :], scores) if self.stop is not None else is_eos
        newly = ends & (self._n_new < 0)
        self._n_new = torch.where(newly, input_ids.shape[1] - self.prompt_len, self._n_new)
        self._at_eos = torch.where(newly, is_eos, self._at_eos)
        return ends

    @property
    def finished(self) -> list[tuple[int, str] | None]:
        """Per row: (new tokens, "eos" or "stop_string") where it finished, else None (read once, after the batch)."""
        if self._finished is None:
            rows = zip(self._n_new.tolist(), self._at_eos.tolist())
            self._finished = [(n, "eos" if eos else "stop_string") if n >= 0 else None for n, eos in rows]
        return self._finished
