"""Beam search on vLLM: `LLM.beam_search` (2 × beams candidates a step, as transformers' generate()).

Its outputs are shaped like `RequestOutput`s (`outputs[0].token_ids`, `text`, `finish_reason`,
`prompt_token_ids`, no request metrics), so `run.py` records and times them as it does the others
(the call's clock: vLLM's beam search keeps no per-request clocks). Supported only where it matches
generate()'s beam search: no stop strings, no minimum length, no repetition penalty, no early
stopping (`worker.core.engines.engine_refusal`); tests/vllm/test_vllm_engine.py checks it token by token.
"""

from __future__ import annotations

from types import SimpleNamespace


def beam_outputs(llm, prompts: list[dict], num_beams: int, max_tokens: int, length_penalty: float) -> list:
    """`prompts`: token-id prompts ({"prompt_token_ids": ...}), as the job feeds every vLLM call."""
    from vllm.sampling_params import BeamSearchParams

    params = BeamSearchParams(beam_width=num_beams, max_tokens=max_tokens, length_penalty=length_penalty)
    results = llm.beam_search(prompts, params)
    tokenizer = llm.get_tokenizer()
    out = []
    for prompt, result in zip(prompts, results):
        prompt_ids = list(prompt["prompt_token_ids"])
        best = result.sequences[0]
        ids = list(best.tokens)[len(prompt_ids) :]
        ended = bool(ids) and ids[-1] == tokenizer.eos_token_id  # on its last allowed token too, as generate()'s
        completion = SimpleNamespace(
            index=0,  # the one completion of its request, as a RequestOutput's first (run._records orders by it)
            token_ids=ids,
            text=tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason="stop" if ended else "length",
            stop_reason=None,
        )
        out.append(SimpleNamespace(outputs=[completion], prompt_token_ids=prompt_ids, metrics=None))
    return out
