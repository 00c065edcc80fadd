"""Diverse (group) beam search (Vijayakumar et al. 2018, "Diverse Beam Search").

The num_beams beams of a prompt are split into num_beam_groups groups of K beams.
At every step the groups are extended in turn; group g runs one step of ordinary beam
search over its K beams, on log-probabilities minus a Hamming diversity term:

    log p(v | beam) - diversity_penalty * #{beams of groups < g that chose v at this step}

so each group is pushed away from the tokens the earlier groups just picked. Group 0 is
never penalised: it is plain beam search with K beams. As in transformers 4.x, the
penalised scores are what accumulate into a beam's score.

Within a group the bookkeeping is transformers 5 `_beam_search`'s (early_stopping=False):
of the group's 2K best continuations, those among the top K that end (EOS, a stopping
criterion, or the length limit) become finished hypotheses scored
sum / new_len ** length_penalty, of which the group keeps its K best, and the K best
that do not stop run on. A group stops improving once its K finished hypotheses cannot
be beaten by its best running beam; from then on it no longer steers the later groups.
The answer is the best finished hypothesis over all groups. With one group this is
exactly transformers' beam search (a test checks it token for token).

transformers 5 moved group beam search out of its core, so this is decodebench's own
loop: one forward pass per step of all batch * num_beams rows over one KV cache, whose
rows are reordered to the surviving beams' parents. Registration is light; torch is
imported only inside `search`.
"""

from __future__ import annotations

from typing import Any

from worker.strategies import Param, Strategy, register


def check_groups(num_beams: int, num_beam_groups: int) -> None:
    if num_beams % num_beam_groups:
        raise ValueError(
            f"num_beams ({num_beams}) must be divisible by num_beam_groups ({num_beam_groups})"
        )


class _DiverseBeam(Strategy):
    """Adds the one check that spans two parameters, so that a sweep fails when it is planned."""

    def validate(self, params: dict[str, Any]) -> dict[str, Any]:
        out = super().validate(params)
        check_groups(out["num_beams"], out["num_beam_groups"])
        return out


register(_DiverseBeam(
    name="diverse_beam",
    description="diverse (group) beam search: beam groups penalised for picking the same tokens",
    params={
        "num_beams": Param(int, 4, "beams kept at each step, over all groups", min=2),
        "num_beam_groups": Param(int, 2, "groups the beams are split into (must divide num_beams)", min=1),
        "diversity_penalty": Param(
            float, 0.5, "subtracted per beam of an earlier group that chose the same token at this step", min=0.0
        ),
        "length_penalty": Param(float, 1.0, "exponent on length in the finished-hypothesis score (>0 favours longer)"),
    },
    stochastic=False,
    # num_beams > 1 makes the engine treat it like beam search (no per-row finish recorder).
    # num_beam_groups stays out of the GenerationConfig: transformers 5 would route it to the hub.
    to_config=lambda p: {
        "do_sample": False,
        "num_beams": p["num_beams"],
        "length_penalty": p["length_penalty"],
        "early_stopping": False,
    },
    loop="worker.strategies.diverse_beam:generate",
    citation="Vijayakumar et al. 2018",
))


def generate(model, enc, config, params, processors, criteria):
    """Run diverse beam search; returns each prompt's best hypothesis, (batch, prompt + new), padded after EOS."""
    import torch

    hyps, scores, lengths = search(model, enc, config, params, processors, criteria)
    best = scores.argmax(dim=-1)  # (B,)
    rows = torch.arange(hyps.shape[0], device=hyps.device)
    width = enc["input_ids"].shape[1] + int(lengths[rows, best].max())
    return hyps[rows, best, :width]


def search(model, enc, config, params, processors, criteria):
    """All finished hypotheses: token ids (B, num_beams, prompt + max_new), scores (B, num_beams), new lengths.

    Hypotheses are grouped: columns g*K .. g*K+K-1 are group g's, best first.
    """
    import inspect

    import torch

    n, groups = params["num_beams"], params["num_beam_groups"]
    check_groups(n, groups)
    k = n // groups
    penalty, length_penalty = params.get("diversity_penalty", 0.0), params.get("length_penalty", 1.0)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

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
            all_stop = torch.ones((), dtype=torch.bool, device=dev)  # every candidate stopped: nothing can run on
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
                all_stop &= stops.all()

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
                    torch.arange(batch, device=dev)[:, None], top]
                fin_len[:, g] = torch.cat([fin_len[:, g], torch.full_like(cand_tok, step + 1)], dim=1).gather(1, top)
                is_done[:, g] = torch.cat([is_done[:, g], finishing], dim=1).gather(1, top)

                if penalty:  # this group's picks count against the later groups (while it still matters)
                    chosen.scatter_add_(1, tokens[:, g], improvable[:, g, None].float().expand(batch, k).contiguous())

            # transformers' early_stopping=False heuristic: a group can still improve while its pool has
            # an empty slot or its best running beam, length-penalised at the current length, beats the worst.
            best_running = run_scores[..., :1] / (step + 1) ** length_penalty
            worst = torch.where(is_done, fin_scores.min(dim=-1, keepdim=True).values, -1e9)
            improvable &= (best_running > worst).any(dim=-1)
            if last or bool(all_stop | ~improvable.any()):
                break

            # Advance every beam by its token: reorder the cache to the parents, one forward pass.
            flat_parents = parents.view(-1)
            seqs = torch.cat([seqs[flat_parents], tokens.view(-1, 1)], dim=-1)
            past.reorder_cache(flat_parents)
            attn = torch.cat([attn, attn.new_ones(batch * n, 1)], dim=-1)  # a prompt's beams share its mask
            out = model(input_ids=tokens.view(-1, 1), attention_mask=attn, position_ids=attn.sum(-1, keepdim=True) - 1,
                        use_cache=True, **{cache_kw: past})
            past = getattr(out, cache_kw)
            logits = out.logits[:, -1, :]
    return fin_ids.view(batch, n, width), fin_scores.view(batch, n), fin_len.view(batch, n)
