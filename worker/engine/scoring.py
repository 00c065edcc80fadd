"""Scoring generations under a model: the token negative log-likelihoods behind perplexity and coherence."""

from __future__ import annotations

import torch

from worker.engine.models import LoadedModel


def score_nll(
    scorer: LoadedModel, pairs: list[tuple[list[int], list[int]]], batch_size: int
) -> list[tuple[float | None, int | None]]:
    """Sum of negative log-likelihoods of each continuation given its context, batched (left padding)."""
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
            ids[r, width - len(seq) :] = torch.tensor(seq)
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
            out.append((float(nll[r]), len(gen)) if gen and ctx else (None, None))
    return out
