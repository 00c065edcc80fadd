"""A strategy variant as vLLM `SamplingParams`, one per generation (each with its own seed).

Only the strategies of `worker.core.engines.VLLM_STRATEGIES` reach here (validation refuses the
others). vLLM's `repetition_penalty` is the CTRL penalty of transformers (logits divided or
multiplied over the prompt's and the output's tokens), `min_tokens` is `min_new_tokens`, and stop
strings end a generation with the text cut before them (`include_stop_str_in_output=False`). A
best_of variant asks for the sampled tokens' log-probabilities (`logprobs=0`; vLLM's default
`logprobs_mode` is the raw model's, before temperature and filters, as the own engine scores). Typical,
epsilon and eta carry their filter in `extra_args` for the decodebench logits processor
(`worker.engine.vllm.logitsprocs`), which reproduces transformers' warpers.
"""

from __future__ import annotations

from typing import Any

from worker.core.contract import GenerationSettings, StrategySpec
from worker.core.engines import VLLM_STRATEGIES
from worker.core.errors import PermanentJobError
from worker.engine.vllm.logitsprocs import FILTER_KEY, KINDS


def sampling_settings(strategy: StrategySpec, generation: GenerationSettings) -> dict[str, Any]:
    """The SamplingParams keyword arguments of a variant, without the seed (pure)."""
    if strategy.name not in VLLM_STRATEGIES:
        raise PermanentJobError(f"refused: strategy {strategy.name} on engine vllm: vLLM has no exact {strategy.name}")
    p = strategy.params
    if strategy.name == "beam":  # LLM.beam_search (worker.engine.vllm.beam): what it takes
        return {"beam_width": p["num_beams"], "max_tokens": generation.max_new_tokens, "temperature": 0.0,
                "length_penalty": p["length_penalty"]}  # fmt: skip
    out: dict[str, Any] = {
        "max_tokens": generation.max_new_tokens,
        "min_tokens": generation.min_new_tokens,
        "stop": list(generation.stop),
        "include_stop_str_in_output": False,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": p.get("repetition_penalty") or 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    if strategy.best_of is not None:  # the sampled tokens' raw log-probabilities rank a prompt's samples
        out["logprobs"] = 0
    if strategy.name != "greedy":
        out["temperature"] = p["temperature"]
    if strategy.name == "top_k":
        out["top_k"] = p["k"]
    elif strategy.name == "top_p":
        out["top_p"] = p["p"]
    elif strategy.name == "min_p":
        out["min_p"] = p["p"]
    elif strategy.name in KINDS:  # transformers' warper, as a logits processor (worker.engine.vllm.logitsprocs)
        out["extra_args"] = {FILTER_KEY: {"kind": strategy.name, "value": p[KINDS[strategy.name]]}}
    return out


def sampling_params(settings: dict[str, Any], seed: int | None):
    """vllm.SamplingParams of `settings` with the generation's seed (None for greedy: no randomness)."""
    from vllm import SamplingParams

    return SamplingParams(**settings, seed=seed)
