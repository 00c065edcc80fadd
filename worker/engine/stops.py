"""Stop strings checked at the cost of one table lookup wherever that is exact.

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
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteria
from transformers.generation.stopping_criteria import StopStringCriteria


class StopStrings(StoppingCriteria):
    """transformers' StopStringCriteria, answered by a table lookup where that is exact."""

    def __init__(self, tokenizer, stop_strings: list[str]) -> None:
        self.criteria = StopStringCriteria(tokenizer, stop_strings)
        self.stop_strings = list(stop_strings)
        table = self.criteria.embedding_vec  # per token: valid positions | end lengths | token length
        strings, positions = self.criteria.num_stop_strings, self.criteria.max_valid_positions
        ends = table[:, positions * strings : -1].unflatten(-1, (strings, -1))  # (tokens, strings, end lengths)
        self.alone = (ends >= self.criteria.target_lens[None, :, None]).any(-1).any(-1)
        self.maybe = (ends > 0).any(-1).any(-1)
        self.exact = not bool((self.maybe & ~self.alone).any())

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if self.alone.device != input_ids.device:
            self.alone, self.maybe = self.alone.to(input_ids.device), self.maybe.to(input_ids.device)
        last = input_ids[:, -1].clamp(max=self.alone.shape[0] - 1)  # out-of-vocabulary ids: the dummy row
        if self.exact:
            return self.alone[last]
        if input_ids.device.type == "cpu" and not bool(self.maybe[last].any()):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)
        return self.criteria(input_ids, scores)
