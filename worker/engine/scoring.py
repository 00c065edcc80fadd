"""Scoring generations under a model: the token negative log-likelihoods behind perplexity and coherence.

One scoring path (docs/metrics.md#perplexity): when the scorer is the generating model, or its
tokenizer is the generating model's (`same_tokenizer`: the same token -> id vocabulary, the same
special tokens, the same ids for the job's prompts), the scorer scores the stored token ids of the
generation in the context of the stored prompt ids, exactly as self-scoring does. Only a scorer with
another tokenizer re-tokenises the prompt and the text. On both paths a generation that ended at
EOS has its EOS scored and counted (the model's choice to stop is part of the generation): the
stored ids end with it, and the re-tokenised text gets the scorer's own EOS appended.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from worker.engine.models import LoadedModel


def _specials(tok) -> tuple:
    return (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id, sorted(tok.all_special_ids))


def same_tokenizer(a, b, probes: Sequence[str] = ()) -> bool:
    """Whether tokenizers `a` and `b` give every token the same id and encode `probes` alike (not by name)."""
    if a is b:
        return True
    if len(a) != len(b) or _specials(a) != _specials(b) or a.get_vocab() != b.get_vocab():
        return False
    probes = list(probes) or ["Hello, world! It was a truth universally acknowledged."]
    return a(probes)["input_ids"] == b(probes)["input_ids"]


def scorer_eos(scorer: LoadedModel) -> int | None:
    """The token the scorer appends to a re-tokenised text that ended at EOS: its tokenizer's EOS, else its
    generation config's first; None when it has none (then that EOS is not scored)."""
    eos = scorer.tokenizer.eos_token_id
    if eos is None:
        eos = getattr(getattr(scorer.model, "generation_config", None), "eos_token_id", None)
        eos = eos[0] if isinstance(eos, list) and eos else eos
    return eos if isinstance(eos, int) else None


def retokenised(scorer: LoadedModel, prompt: str, text: str, stop_reason: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) of a generation under a scorer with another tokenizer: the prompt and
    the text tokenised apart, and the scorer's EOS appended where the generation ended at EOS."""
    ctx = scorer.tokenizer(prompt)["input_ids"]
    cont = scorer.tokenizer(text, add_special_tokens=False)["input_ids"]
    eos = scorer_eos(scorer)
    if stop_reason == "eos" and eos is not None:
        cont = [*cont, eos]
    return ctx, cont


def score_nll(
    scorer: LoadedModel, pairs: list[tuple[list[int], list[int]]], batch_size: int
) -> list[tuple[float | None, int | None]]:
    """Sum of negative log-likelihoods of each continuation given its context, batched (left padding).

    An empty continuation scores (0.0, 0): nothing to score, which the metrics leave out; an empty
    context (no token to condition the first one on) scores (None, None)."""
    out: list[tuple[float | None, int | None]] = []
    pad = scorer.tokenizer.pad_token_id
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        width = max(len(c) + len(g) for c, g in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        target = torch.zeros((len(chunk), width), dtype=torch.bool)
        for r, (ctx, gen) in enumerate(chunk):
            seq = ctx + gen
            ids[r, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            attn[r, width - len(seq) :] = 1
            target[r, width - len(gen) :] = bool(gen)
        ids, attn, target = ids.to(scorer.device), attn.to(scorer.device), target.to(scorer.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = scorer.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        mask = target[:, 1:]
        nll = -(logp * mask).sum(-1)
        for r, (ctx, gen) in enumerate(chunk):
            out.append((None, None) if not ctx else (float(nll[r]), len(gen)) if gen else (0.0, 0))
    return out
