"""Perplexity's scores of a vLLM job's generations, from vLLM itself (docs/metrics.md, "What is scored").

The own engine scores each generation's stored token ids under the generating model (the default scorer) in a
pass after the timed batches; so does this, with vLLM's prompt log-probabilities (`SamplingParams(prompt_logprobs=0)`:
the raw model's, before any processor) of prompt + generated ids, outside the timing. A sweep's own `scorer` is a
transformers model, which only the own engine runs: a vLLM job with one records no scores and says so.
"""

from __future__ import annotations


def score_nll(llm, rows: list[tuple[list[int], list[int]]]) -> list[tuple[float, int]]:
    """(nll_sum, nll_count) of each (prompt ids, generated ids): Σ −ln p of the generated ids after what precedes
    them; (0.0, 0) for a generation with no token, as the own engine records it. The last id is the one request
    token, held to it (`allowed_token_ids`; its raw log-probability is taken before that mask): prompt + generation
    may fill max_model_len, past which vLLM takes no prompt."""
    from vllm import SamplingParams

    todo = [(i, prompt, new) for i, (prompt, new) in enumerate(rows) if new]
    params = [
        SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, logprobs=0, allowed_token_ids=[new[-1]])
        for _, _, new in todo
    ]
    fed = [{"prompt_token_ids": prompt + new[:-1]} for _, prompt, new in todo]
    outs = llm.generate(fed, params, use_tqdm=False) if todo else []
    scores = [(0.0, 0)] * len(rows)
    for (i, prompt, new), out in zip(todo, outs, strict=True):
        entries = out.prompt_logprobs[len(prompt) :]  # entry k: the log-probabilities of token k given those before
        total = sum(entry[token].logprob for entry, token in zip(entries, new[:-1], strict=True))
        scores[i] = (-(total + out.outputs[0].logprobs[0][new[-1]].logprob), len(new))
    return scores
