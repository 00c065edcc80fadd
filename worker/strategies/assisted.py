"""Assisted decoding (speculative decoding with a draft model; Leviathan et al. 2023,
Chen et al. 2023), through transformers' own `assistant_model` support.

A small assistant drafts `num_assistant_tokens` tokens, the main model verifies them
in one forward pass and keeps the longest agreeing prefix. With greedy verification
the output is exactly greedy search's: only the speed changes, which is what a sweep
measures. The assistant must share the main model's tokenizer. transformers runs
assisted generation one prompt at a time, so the engine splits batches to size 1 for
this strategy and records that in the result's notes.
"""

from __future__ import annotations

from worker.strategies.registry import Kind, Param, Strategy, register

register(
    Strategy(
        name="assisted",
        description="assisted (speculative) decoding: a draft model proposes, the model verifies greedily",
        params={
            "assistant": Param(str, None, "draft model: local path (relative to the spec) or hub id", is_path=True),
            "num_assistant_tokens": Param(
                int, 5, "tokens drafted per step (initial value under the heuristic schedule)", min=1
            ),
            "schedule": Param(str, "constant", "draft length schedule", choices=("constant", "heuristic")),
        },
        stochastic=False,
        kind=Kind.ASSISTED,
        to_config=lambda p: {
            "do_sample": False,
            "num_beams": 1,
            "num_assistant_tokens": p["num_assistant_tokens"],
            "num_assistant_tokens_schedule": p["schedule"],
        },
        citation="Leviathan et al. 2023",
    )
)
