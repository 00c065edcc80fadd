"""Repetition penalty, no-repeat n-grams and a minimum length, row by row, for the engine's decode loop.

transformers' processors, called on a padded batch as a custom loop calls them, see it as
one tensor: the repetition penalty counts the pad id as a token of every padded row (with
pad = EOS, as in GPT-2 style tokenizers, a padded row's EOS is penalised and it ends later
than it would alone; generate() itself passes the padding lengths to the penalty), the
n-gram ban counts windows that start in the padding, and the minimum length counts from
the batch's start. `RowModifiers` applies the same three rules to each row's own tokens: the columns
its attention mask hides (left padding, the gap before a row that joined a stream) are not
its tokens, and its length is its own step counter. So a row computes what it computes
alone, in any batch and in a continuous-refill stream, where rows start at different steps.

Everything is vectorised over the batch (no loop over rows, no host synchronisation), and
a row alone gets exactly transformers' processors (`tests/unit/worker/engine/test_modifiers.py`). Every step of the
decode loop (greedy search, sampling, contrastive and beam search) applies them so.
"""

from __future__ import annotations

import torch
from transformers.generation import logits_process as lp

# GenerationConfig fields that make generate() add processors the engine does not build.
_UNSUPPORTED_IF_SET = (
    "bad_words_ids",
    "begin_suppress_tokens",
    "suppress_tokens",
    "sequence_bias",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "exponential_decay_length_penalty",
    "top_h",
    "watermarking_config",
    "renormalize_logits",
)


# Every GenerationConfig field of a processor the engine does not build (worker.engine.plan resets a checkpoint's).
PROCESSORS = (
    *_UNSUPPORTED_IF_SET,
    "guidance_scale",
    "encoder_repetition_penalty",
    "min_length",
    "encoder_no_repeat_ngram_size",
    "remove_invalid_values",
)


def only_modifiers(config) -> bool:
    """Whether generate() would apply no processor to this configuration beyond the repetition
    penalty, the no-repeat n-gram ban and the minimum new tokens (what the engine rebuilds)."""
    if any(getattr(config, name, None) for name in _UNSUPPORTED_IF_SET):
        return False
    if (config.guidance_scale or 1.0) != 1.0 or (config.encoder_repetition_penalty or 1.0) != 1.0:
        return False
    return not (config.min_length or config.encoder_no_repeat_ngram_size or config.remove_invalid_values)


def any_set(config) -> bool:
    """Whether the configuration sets a penalty or a minimum length (what `RowModifiers` applies)."""
    penalty = config.repetition_penalty not in (None, 1.0)
    return bool(config.min_new_tokens) or penalty or bool(config.no_repeat_ngram_size)


class RowModifiers:
    """The modifiers of a GenerationConfig, applied per row: `modifiers(rows, scores)`."""

    def __init__(self, config) -> None:
        penalty = config.repetition_penalty
        self.penalty = lp.RepetitionPenaltyLogitsProcessor(penalty) if penalty not in (None, 1.0) else None
        self.ngram = config.no_repeat_ngram_size or 0
        self.min_new = config.min_new_tokens or 0
        eos = config.eos_token_id
        self.eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        self._eos: torch.Tensor | None = None

    def __call__(self, rows, scores: torch.Tensor) -> torch.Tensor:
        """`rows`: the loop's Rows (ids, attention mask, per-row steps); returns the modified scores."""
        if self.min_new and self.eos:
            short = (rows.steps < self.min_new)[:, None]
            scores = scores.masked_fill(short & self._eos_mask(scores), -float("inf"))
        if not (self.penalty or self.ngram):
            return scores
        mine = rows.attn.bool()
        if self.penalty is not None:
            # a hidden column stands in as the row's last token, already among its own: the set is the row's
            scores = self.penalty(torch.where(mine, rows.ids, rows.ids[:, -1:]), scores)
        if self.ngram:
            scores = self._ban_repeats(rows.ids, mine, scores)
        return scores

    def _eos_mask(self, scores: torch.Tensor) -> torch.Tensor:
        """The vocabulary's EOS ids as a mask, made once on the scores' device (no copy per step)."""
        if self._eos is None or self._eos.shape[0] != scores.shape[-1]:
            self._eos = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
            for e in self.eos:  # one fill kernel each: no index tensor copied, no host sync
                if e < scores.shape[-1]:
                    self._eos[e : e + 1].fill_(True)  # `mask[e] = True` copies a CPU scalar: a blocking copy
        return self._eos

    def _ban_repeats(self, ids: torch.Tensor, mine: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """transformers' NoRepeatNGram (match the last n-1 tokens against every window, ban the window's
        last token), with only the windows wholly inside the row's own tokens."""
        n = self.ngram
        width = ids.shape[-1]
        if width < n:
            return scores
        prefix = ids[:, width + 1 - n :]
        windows = ids.unfold(1, n, 1)
        matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(-1) & mine.unfold(1, n, 1).all(-1)
        # a row with fewer than n tokens of its own has no whole window, and so no ban: as alone
        vocab = scores.shape[-1]
        banned = scores.new_zeros((scores.shape[0], vocab + 1), dtype=torch.bool)
        banned.scatter_(1, torch.where(matches, windows[..., -1].clamp(max=vocab), vocab), True)
        return scores.masked_fill(banned[:, :vocab], -float("inf"))
