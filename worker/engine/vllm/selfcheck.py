"""The distribution check a vLLM job runs for the report (docs/engines.md, "Reading a cross-engine
comparison"): the first job of each seed of a sampled cell (its first shard) draws the first token
of its first prompt (the token ids the job fed vLLM: a chat model's rendered template) `DRAWS` times
(one seed each) and G-tests the draws against the strategy's exact distribution by its definition
(`worker.engine.vllm.agreement.filtered_probs`, float64) from the very logits vLLM sampled from (its raw
log-probabilities of the whole vocabulary, `logprobs=-1`). The result lands in result.json's
`engine.distribution_check` and the report's `engine_gtest_p` column.

It tests vLLM's sampling against the definition on vLLM's own logits; that vLLM's logits are the
model's is what greedy's token agreement (`engine_agreement`) and the tests' check against
transformers' logits show. Not run with a repetition penalty (the definition here has none) or for
beam search and greedy (deterministic: compared token for token).
"""

from __future__ import annotations

from typing import Any

import torch

from worker.core.contract import JobSpec
from worker.engine.sampling import generation_seed
from worker.engine.vllm.agreement import filtered_probs, g_test
from worker.engine.vllm.params import sampling_params

DRAWS = 1000
CHECKED = ("sample", "top_k", "top_p", "min_p", "typical", "epsilon", "eta")


def wanted(job: JobSpec) -> bool:
    """The first shard of each seed of a sampled cell without a penalty runs the check."""
    penalty = job.strategy.params.get("repetition_penalty") or 1.0
    return job.strategy.name in CHECKED and penalty == 1.0 and job.shard == 0


def vllm_logits(llm, prompt: str | dict[str, list[int]], settings: dict[str, Any]) -> torch.Tensor:
    """vLLM's raw log-probabilities of the token after `prompt` (text, or token ids as {"prompt_token_ids": ...}),
    the whole vocabulary (float64)."""
    probe = {**settings, "n": 1, "max_tokens": 1, "min_tokens": 0, "stop": [], "logprobs": -1}
    (out,) = llm.generate([prompt], [sampling_params(probe, 0)], use_tqdm=False)
    table = out.outputs[0].logprobs[0]
    logits = torch.full((max(table) + 1,), -torch.inf, dtype=torch.float64)
    for token, entry in table.items():
        logits[token] = entry.logprob
    return logits


def distribution_check(
    job: JobSpec, llm, settings: dict[str, Any], ids: list[int], draws: int = DRAWS
) -> dict[str, Any] | None:
    """The first-token G-test of `wanted` jobs after their first prompt's token `ids` (what the job fed vLLM: until
    2026-12-08 the raw text, so a chat cell's check was of another prompt than its own), as recorded in
    result.json; None for the others. A check
    this vLLM cannot run (its full-vocabulary log-probabilities refused) is recorded as such; the job's
    generations stand."""
    if not wanted(job):
        return None
    try:
        return _check(job, llm, settings, {"prompt_token_ids": ids}, draws)
    except Exception as err:  # a check of the engine, never the job's failure
        return {"error": f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"}


def _check(job: JobSpec, llm, settings: dict[str, Any], fed: dict[str, list[int]], draws: int) -> dict[str, Any]:
    prompt = job.prompts[0]
    first = {**settings, "n": 1, "max_tokens": 1, "min_tokens": 0, "stop": []}
    seeds = [generation_seed(job.seed, f"{prompt.id}#check{i}") for i in range(draws)]
    outs = llm.generate([fed] * draws, [sampling_params(first, s) for s in seeds], use_tqdm=False)
    exact = filtered_probs(vllm_logits(llm, fed, settings), job.strategy.name, job.strategy.params)
    result = g_test([o.outputs[0].token_ids[0] for o in outs], exact)
    return {
        "test": "G-test of the first token against the strategy's definition on vLLM's logits",
        "prompt_id": prompt.id,
        "prompt_tokens": len(fed["prompt_token_ids"]),  # as the job fed it (a chat model's rendered template)
        "draws": result.n,
        "g": result.g,
        "dof": result.dof,
        "p_value": result.p_value,
        "outside_support": result.outside_support,
    }
