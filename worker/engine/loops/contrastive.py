"""Contrastive search's decoding loop (see `worker.strategies.contrastive` for the method).

One forward pass of B*k candidate tokens per step, with the KV cache repeated k times
and the winners' rows selected back, as the original implementation does.
"""

from __future__ import annotations

import inspect

import torch


def generate(model, enc, config, params, processors, criteria):
    """Run contrastive search; returns the (batch, prompt + new) token ids like generate().

    Rows that have finished leave the candidate pass (compaction): the cache, hidden-state
    context and mask keep only the live rows, so a finished row costs no more k-candidate
    forwards. The processors and stopping criteria still see the whole batch (finished rows
    get pad tokens), so their per-row state is the batch's as before."""
    k, alpha = params["k"], params["alpha"]
    # transformers >= 5.2x names the KV cache `cache`; earlier releases `past_key_values`
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    input_ids, attn = enc["input_ids"], enc["attention_mask"]
    batch = input_ids.shape[0]
    pad = config.pad_token_id
    live = torch.arange(batch, device=input_ids.device)  # the batch rows still decoding

    with torch.inference_mode():
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True, output_hidden_states=True
        )
        past = getattr(out, cache_kw)
        context = out.hidden_states[-1]  # (live, T, D)
        context_mask = attn.bool()
        logits = out.logits[:, -1, :]  # (batch, vocab): a finished row keeps its last, unused
        unfinished = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
        for _ in range(config.max_new_tokens):
            scores = processors(input_ids, logits.float())
            top_p, top_ids = torch.softmax(scores[live], dim=-1).topk(k, dim=-1)  # (live, k)
            n = live.numel()
            rows = torch.arange(n, device=live.device)

            cand, hidden = _candidates(model, cache_kw, past, attn, top_ids)
            best = _best(hidden, context, context_mask, top_p, alpha)  # (live,)

            chosen = rows * k + best
            past = getattr(cand, cache_kw)
            past.batch_select_indices(chosen)
            logits = logits.index_copy(0, live, cand.logits[chosen, -1, :].to(logits.dtype))
            next_tokens = torch.full((batch,), pad, dtype=input_ids.dtype, device=input_ids.device)
            next_tokens[live] = top_ids[rows, best]
            context = torch.cat([context, hidden[rows, best][:, None, :]], dim=1)
            context_mask = torch.cat([context_mask, context_mask.new_ones(n, 1)], dim=-1)
            attn = torch.cat([attn, attn.new_ones(n, 1)], dim=-1)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            unfinished &= ~criteria(input_ids, scores)
            keep = unfinished[live]
            if not bool(keep.all()):  # rows finished: they leave the candidate pass
                if not bool(keep.any()):
                    break
                kept = keep.nonzero().squeeze(1)
                live, context, context_mask, attn = live[kept], context[kept], context_mask[kept], attn[kept]
                past.batch_select_indices(kept)
    return input_ids


def _candidates(model, cache_kw: str, past, attn, top_ids):
    """One forward pass of every live row's k candidates over its cache repeated k times:
    the output and the candidates' last hidden states (live, k, D)."""
    n, k = top_ids.shape
    past.batch_repeat_interleave(k)
    cand_attn = torch.cat([attn, attn.new_ones(n, 1)], dim=-1).repeat_interleave(k, dim=0)
    cand_pos = attn.sum(-1, keepdim=True).repeat_interleave(k, dim=0)
    cand = model(
        input_ids=top_ids.reshape(-1, 1),
        attention_mask=cand_attn,
        position_ids=cand_pos,
        use_cache=True,
        output_hidden_states=True,
        **{cache_kw: past},
    )
    return cand, cand.hidden_states[-1][:, -1, :].reshape(n, k, -1)


def _best(hidden, context, context_mask, top_p, alpha: float):
    """Each row's winner: (1 - alpha) p(v) - alpha max_j cos(h_v, h_j) over its context."""
    sim = torch.einsum(
        "bkd,btd->bkt",
        torch.nn.functional.normalize(hidden.float(), dim=-1),
        torch.nn.functional.normalize(context.float(), dim=-1),
    ).masked_fill(~context_mask[:, None, :], -float("inf"))
    penalty = sim.max(dim=-1).values  # (live, k)
    return ((1 - alpha) * top_p - alpha * penalty).argmax(dim=-1)
