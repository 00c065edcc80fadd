"""Contrastive search (Su et al. 2022, "A Contrastive Framework for Neural Text Generation").

At each step the k most likely tokens are candidates; each is scored

    (1 - alpha) * p(v | x_<t)  -  alpha * max_j cos(h_v, h_j)

where h_v is the candidate's last hidden state and h_j those of the context (padding
excluded), and the best candidate is kept. transformers 5 moved contrastive search out
of its core, so this is decodebench's own loop: one forward pass of B*k candidate
tokens per step, with the KV cache repeated k times and the winners' rows selected
back, as the original implementation does. alpha = 0 (or k = 1) is greedy search.

Registration is light; torch is imported only inside `generate`.
"""

from __future__ import annotations

from worker.strategies import Param, Strategy, register

register(Strategy(
    name="contrastive",
    description="contrastive search: model confidence minus a degeneration penalty",
    params={
        "k": Param(int, 4, "candidate tokens per step (top-k)", min=1),
        "alpha": Param(float, 0.6, "weight of the degeneration penalty", min=0.0, max=1.0),
    },
    stochastic=False,
    to_config=lambda p: {"do_sample": False, "num_beams": 1},
    loop="worker.strategies.contrastive:generate",
    citation="Su et al. 2022",
))


def generate(model, enc, config, params, processors, criteria):
    """Run contrastive search; returns the (batch, prompt + new) token ids like generate()."""
    import torch

    import inspect

    k, alpha = params["k"], params["alpha"]
    # transformers >= 5.2x names the KV cache `cache`; earlier releases `past_key_values`
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    input_ids, attn = enc["input_ids"], enc["attention_mask"]
    batch = input_ids.shape[0]
    pad = config.pad_token_id
    rows = torch.arange(batch, device=input_ids.device)

    with torch.inference_mode():
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True, output_hidden_states=True)
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
            cand = model(input_ids=top_ids.reshape(-1, 1), attention_mask=cand_attn, position_ids=cand_pos,
                         use_cache=True, output_hidden_states=True, **{cache_kw: past})
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
