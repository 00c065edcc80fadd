"""Beam search's batch search, with groups: diverse beam search (`worker.strategies.diverse_beam`
has the method) and, with one group and no diversity penalty, transformers' beam search.

A documented kernel: `search` is one long function on purpose, so that each step's
bookkeeping reads top to bottom as in transformers' `_beam_search`.

The `beam` strategy runs here too where this loop reproduces generate()'s beam search
(`supports`: early_stopping True or False, one sequence returned, no processor beyond the
penalties and the minimum length, transformers' dynamic cache; and `kvcache.reorderable`:
the model's cache is plain full or sliding-window attention layers); the plan picks it
(worker.engine.plan). Where the model takes the preallocated cache, the same search runs as
a step of the decode loop instead (`beam_step.BeamStep`: compaction and continuous refill),
and this batch search serves the rest.

Prompts whose search is over leave the forward pass (compaction): a prompt is over once
none of its groups can improve, or once every candidate of every group stopped (nothing
can run on). The KV cache, the mask and the fed tokens keep only the live prompts' beams;
the bookkeeping (scores, pools, the processors' view of the token ids) stays batch-wide,
where a prompt that is over changes nothing, so every prompt's hypotheses are the ones it
gets searched alone, whatever the batch.
"""

from __future__ import annotations

import torch

from worker.engine.models import cache_keyword
from worker.engine.modifiers import only_modifiers
from worker.strategies.diverse_beam import check_groups


def supports(config) -> bool:
    """Whether this loop reproduces generate()'s beam search for the configuration."""
    if config.num_beams <= 1 or config.do_sample or (config.num_return_sequences or 1) != 1:
        return False
    if config.early_stopping not in (True, False):  # "never" estimates the best length otherwise
        return False
    if getattr(config, "cache_implementation", None) not in (None, "dynamic"):
        return False
    return only_modifiers(config)


def beam_params(config) -> dict:
    """The loop's parameters for plain beam search: one group, no diversity penalty."""
    return {
        "num_beams": config.num_beams,
        "num_beam_groups": 1,
        "diversity_penalty": 0.0,
        "length_penalty": config.length_penalty,
        "early_stopping": config.early_stopping,
    }


def generate(model, enc, config, params, processors, criteria, check_every: int = 1, mask: bool = False):
    """Run (diverse) beam search; returns each prompt's best hypothesis, (batch, prompt + new), padded after EOS.

    `mask`: the batch searches' common signature (contrastive search's candidates use it); the beams
    are rows of their own and take transformers' mask."""
    hyps, scores, lengths = search(model, enc, config, params, processors, criteria, check_every)
    best = scores.argmax(dim=-1)  # (B,)
    rows = torch.arange(hyps.shape[0], device=hyps.device)
    width = enc["input_ids"].shape[1] + int(lengths[rows, best].max())
    return hyps[rows, best, :width]


def search(model, enc, config, params, processors, criteria, check_every: int = 1):
    """All finished hypotheses: token ids (B, num_beams, prompt + max_new), scores (B, num_beams), new lengths.

    Hypotheses are grouped: columns g*K .. g*K+K-1 are group g's, best first. Prompts whose
    search is over leave the forward pass at the checks, every `check_every` steps (each is a
    host synchronisation: every 8 on CUDA); between checks they run on, changing nothing.
    """
    n, groups = params["num_beams"], params["num_beam_groups"]
    check_groups(n, groups)
    k = n // groups
    penalty, length_penalty = params.get("diversity_penalty", 0.0), params.get("length_penalty", 1.0)
    full_stops = params.get("early_stopping", False) is True  # a group with K hypotheses is done (as generate())
    cache_kw = cache_keyword(model)  # `cache` in transformers >= 5.2x, `past_key_values` before

    input_ids, prompt_attn = enc["input_ids"], enc["attention_mask"]
    batch, prompt_len = input_ids.shape
    dev = input_ids.device
    eos_ids = config.eos_token_id
    eos_ids = [] if eos_ids is None else [eos_ids] if isinstance(eos_ids, int) else list(eos_ids)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=dev)
    pad = config.pad_token_id if config.pad_token_id is not None else (int(eos[0]) if len(eos) else 0)
    max_new = config.max_new_tokens
    width = prompt_len + max_new
    n_cand = max(2, 1 + len(eos)) * k  # enough candidates that K survive even if some end
    may_finish = torch.arange(n_cand, device=dev) < k  # only the top K candidates may become hypotheses
    row_base = (torch.arange(batch, device=dev) * n)[:, None]  # first row of each prompt

    # Running beams, one row per (prompt, group, beam): row = b*N + g*K + beam.
    seqs = input_ids.repeat_interleave(n, dim=0)
    attn = prompt_attn.repeat_interleave(n, dim=0)
    run_scores = torch.full((batch, groups, k), -1e9, device=dev)
    run_scores[..., 0] = 0.0  # only the first beam of each group is live at the start (all are copies)
    # Finished hypotheses, K slots per group (is_done marks real ones; empty slots score ~-1e9).
    fin_ids = torch.full((batch, groups, k, width), pad, dtype=torch.long, device=dev)
    fin_scores = torch.full((batch, groups, k), -1e9, device=dev)
    fin_len = torch.zeros((batch, groups, k), dtype=torch.long, device=dev)
    is_done = torch.zeros((batch, groups, k), dtype=torch.bool, device=dev)
    improvable = torch.ones((batch, groups), dtype=torch.bool, device=dev)
    live = torch.arange(batch, device=dev)  # the prompts still searched: their beams are the cache's rows

    with torch.inference_mode():
        # Prefill once per prompt, then copy the cache to the prompt's N beams.
        pos = (prompt_attn.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=input_ids, attention_mask=prompt_attn, position_ids=pos, use_cache=True)
        past = getattr(out, cache_kw)
        past.batch_repeat_interleave(n)
        logits = out.logits[:, -1, :].repeat_interleave(n, dim=0)
        for step in range(max_new):
            last = step == max_new - 1
            logp = processors(seqs, torch.log_softmax(logits.float(), dim=-1))  # engine timer, penalties
            vocab = logp.shape[-1]
            logp = logp.view(batch, groups, k, vocab)
            chosen = logp.new_zeros(batch, vocab)  # per prompt: how many earlier-group beams picked each token now
            parents = torch.empty((batch, groups, k), dtype=torch.long, device=dev)
            tokens = torch.empty((batch, groups, k), dtype=torch.long, device=dev)
            all_stop = torch.ones(batch, dtype=torch.bool, device=dev)  # per prompt: every candidate stopped
            for g in range(groups):
                step_scores = logp[:, g]
                if penalty and g:  # Hamming diversity against groups 0..g-1 at this step
                    step_scores = step_scores - penalty * chosen[:, None, :]
                total = (run_scores[:, g, :, None] + step_scores).reshape(batch, k * vocab)
                cand_scores, flat = total.topk(n_cand, dim=-1)  # (B, 2K), best first
                cand_rows = row_base + g * k + flat // vocab
                cand_tok = flat % vocab
                cand_ids = torch.cat([seqs[cand_rows.reshape(-1)], cand_tok.reshape(-1, 1)], dim=-1)
                stops = torch.isin(cand_tok, eos) | criteria(cand_ids, None).view(batch, n_cand)
                ends = stops | last  # at the length limit every candidate is a hypothesis
                all_stop &= stops.all(dim=-1)

                # The K best candidates that do not stop run on (and are this group's picks for the Hamming term).
                kept_scores, keep = (cand_scores - 1e9 * stops.float()).topk(k, dim=-1)
                run_scores[:, g] = kept_scores
                parents[:, g] = cand_rows.gather(1, keep)
                tokens[:, g] = cand_tok.gather(1, keep)

                # Ending candidates among the top K become hypotheses (length-penalised), if the group
                # can still improve; merge them with the group's pool and keep its K best.
                finishing = ends & may_finish & improvable[:, g, None]
                hyp_scores = cand_scores / (step + 1) ** length_penalty - 1e9 * (~finishing).float()
                hyp_ids = torch.nn.functional.pad(cand_ids, (0, width - cand_ids.shape[1]), value=pad)
                merged_scores = torch.cat([fin_scores[:, g], hyp_scores], dim=1)
                top = merged_scores.topk(k, dim=-1).indices
                fin_scores[:, g] = merged_scores.gather(1, top)
                fin_ids[:, g] = torch.cat([fin_ids[:, g], hyp_ids.view(batch, n_cand, width)], dim=1)[
                    torch.arange(batch, device=dev)[:, None], top
                ]
                fin_len[:, g] = torch.cat([fin_len[:, g], torch.full_like(cand_tok, step + 1)], dim=1).gather(1, top)
                is_done[:, g] = torch.cat([is_done[:, g], finishing], dim=1).gather(1, top)

                if penalty:  # this group's picks count against the later groups (while it still matters)
                    chosen.scatter_add_(1, tokens[:, g], improvable[:, g, None].float().expand(batch, k).contiguous())

            # transformers' early_stopping=False heuristic: a group can still improve while its pool has
            # an empty slot or its best running beam, length-penalised at the current length, beats the worst.
            best_running = run_scores[..., :1] / (step + 1) ** length_penalty
            worst = torch.where(is_done, fin_scores.min(dim=-1, keepdim=True).values, -1e9)
            improvable &= (best_running > worst).any(dim=-1) & ~all_stop[:, None]  # nothing runs on: over
            if full_stops:
                improvable &= ~is_done.all(dim=-1)
            if last:
                break
            searched = improvable.any(dim=-1)
            still = int(searched.sum()) if (step + 1) % check_every == 0 else live.numel()  # a check: one sync
            if still == 0:
                break

            # Advance every beam by its token: one index reorders the live prompts' beams in the cache to
            # their parents and drops the prompts whose search is over (compaction), one forward pass.
            flat_parents = parents.view(-1)
            seqs = torch.cat([seqs[flat_parents], tokens.view(-1, 1)], dim=-1)
            attn = torch.cat([attn, attn.new_ones(batch * n, 1)], dim=-1)  # a prompt's beams share its mask
            place = torch.arange(live.numel(), device=dev)  # each live prompt's place among the cache's
            if still < live.numel():
                place = searched[live].nonzero().squeeze(1)
                live = live[place]
            past.reorder_cache(_cache_rows(parents[live], live, place, n))
            if live.numel() == batch:  # no prompt is over yet: the cache's rows are the batch's
                past, logits = _forward(model, cache_kw, past, tokens, attn)
            else:
                rows = _beam_rows(live, n)
                past, step_logits = _forward(model, cache_kw, past, tokens[live], attn[rows])
                logits = logits.index_copy(0, rows, step_logits)
    return fin_ids.view(batch, n, width), fin_scores.view(batch, n), fin_len.view(batch, n)


def _beam_rows(prompts: torch.Tensor, n: int) -> torch.Tensor:
    """The rows of these prompts' n beams each, prompt after prompt."""
    return (prompts[:, None] * n + torch.arange(n, device=prompts.device)).view(-1)


def _cache_rows(parents: torch.Tensor, live: torch.Tensor, place: torch.Tensor, n: int) -> torch.Tensor:
    """The parents of the `live` prompts' beams (batch-wide rows) as rows of the cache, where prompt
    `live[i]`'s beams are rows place[i]*n ..: one index both reorders the beams and drops the prompts
    that are over (a beam's parent is always one of its own prompt's beams)."""
    return (parents - live[:, None, None] * n + place[:, None, None] * n).view(-1)


def _forward(model, cache_kw: str, past, tokens: torch.Tensor, attn: torch.Tensor):
    """One decoding step of the cache's rows: (the cache, each row's last logits)."""
    out = model(
        input_ids=tokens.reshape(-1, 1),
        attention_mask=attn,
        position_ids=attn.sum(-1, keepdim=True) - 1,
        use_cache=True,
        **{cache_kw: past},
    )
    return getattr(out, cache_kw), out.logits[:, -1, :]
