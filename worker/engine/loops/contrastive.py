"""Contrastive search's decoding loop (see `worker.strategies.contrastive` for the method).

One forward pass of B*k candidate tokens per step, with the KV cache repeated k times
and the winners' rows selected back, as the original implementation does.
"""

from __future__ import annotations

import inspect

import torch


def generate(model, enc, config, params, processors, criteria):
    """Run contrastive search; returns the (batch, prompt + new) token ids like generate()."""
    k, alpha = params["k"], params["alpha"]
    # transformers >= 5.2x names the KV cache `cache`; earlier releases `past_key_values`
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    input_ids, attn = enc["input_ids"], enc["attention_mask"]
    batch = input_ids.shape[0]
    pad = config.pad_token_id
    rows = torch.arange(batch, device=input_ids.device)

    with torch.inference_mode():
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True, output_hidden_states=True
        )
        past = getattr(out, cache_kw)
        context = out.hidden_states[-1]  # (B, T, D)
        context_mask = attn.bool()
        logits = out.logits[:, -1, :]
        unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
        for _ in range(config.max_new_tokens):
            scores = processors(input_ids, logits.float())
            probs = torch.softmax(scores, dim=-1)
            top_p, top_ids = probs.topk(k, dim=-1)  # (B, k)

            past.batch_repeat_interleave(k)
            cand_attn = torch.cat([attn, attn.new_ones(batch, 1)], dim=-1).repeat_interleave(k, dim=0)
            cand_pos = attn.sum(-1, keepdim=True).repeat_interleave(k, dim=0)
            cand = model(
                input_ids=top_ids.reshape(-1, 1),
                attention_mask=cand_attn,
                position_ids=cand_pos,
                use_cache=True,
                output_hidden_states=True,
                **{cache_kw: past},
            )
            hidden = cand.hidden_states[-1][:, -1, :].reshape(batch, k, -1)  # (B, k, D)

            sim = torch.einsum(
                "bkd,btd->bkt",
                torch.nn.functional.normalize(hidden.float(), dim=-1),
                torch.nn.functional.normalize(context.float(), dim=-1),
            ).masked_fill(~context_mask[:, None, :], -float("inf"))
            penalty = sim.max(dim=-1).values  # (B, k)
            best = ((1 - alpha) * top_p - alpha * penalty).argmax(dim=-1)  # (B,)

            chosen = rows * k + best
            past = getattr(cand, cache_kw)
            past.batch_select_indices(chosen)
            logits = cand.logits[chosen, -1, :]
            next_tokens = top_ids[rows, best]
            next_tokens = torch.where(unfinished, next_tokens, torch.full_like(next_tokens, pad))
            context = torch.cat([context, hidden[rows, best][:, None, :]], dim=1)
            context_mask = torch.cat([context_mask, context_mask.new_ones(batch, 1)], dim=-1)
            attn = torch.cat([attn, attn.new_ones(batch, 1)], dim=-1)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            unfinished &= ~criteria(input_ids, scores)
            if not bool(unfinished.any()):
                break
    return input_ids
