"""Does every generation fit its model? The longest prompt plus max_new_tokens against the
model's positions, checked at validation where the model's files can be read here.

A model past its positions fails on a GPU with a device-side assert (on CPU an IndexError)
after it has been loaded, and would be retried: the check refuses such a sweep before any
job exists. It reads the model directory's `config.json` and, where there is one, its fast
tokenizer (`tokenizer.json`, with the `tokenizers` library: no torch). A hub id, or a path
that only the workers can see, is checked by the worker before it allocates anything
(`worker.core.policy.context_refusal`, the same rule). A chat model's prompts are measured as its
template renders them, and a prompt the template cannot take is refused here (controller.sweep.chat).
"""

from __future__ import annotations

import json
from pathlib import Path

from controller.sweep.chat import rendered_prompts
from worker.core.contract import JobSpec
from worker.core.errors import UsageError


def _read_config(path: str) -> dict | None:
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # a hub id or a path seen only by the workers: the worker checks
    return config if isinstance(config, dict) else None


def _longest_prompt(path: str, texts: list[str], special: bool) -> int:
    """Tokens of the longest prompt under the model's fast tokenizer; 0 where it cannot be read here.
    `special`: add the tokenizer's special tokens (a raw prompt; a rendered chat template holds its own)."""
    file = Path(path) / "tokenizer.json"
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(file))
    except Exception:  # not installed, no such file, or a file tokenizers cannot read (its own error type)
        return 0
    encodings = tokenizer.encode_batch(texts, add_special_tokens=special)
    return max((len(e.ids) for e in encodings), default=0)


def check_context(jobs: list[JobSpec]) -> None:
    """UsageError naming the first model whose positions the longest prompt plus max_new_tokens exceed, or
    a prompt its chat template cannot take (controller.sweep.chat)."""
    from worker.core import policy

    models = {j.model.label: j.model for j in jobs}.values()
    prompts = list({p.id: p for j in jobs for p in j.prompts}.values())
    max_new_tokens = jobs[0].generation.max_new_tokens
    for model in models:
        rendered = rendered_prompts(model, prompts)
        config = _read_config(model.path)
        positions = policy.model_positions(config) if config else None
        if positions is None:
            continue
        texts = [p.prompt for p in prompts] if rendered is None else rendered
        longest = _longest_prompt(model.path, texts, special=rendered is None)
        why = policy.context_refusal(positions, longest, max_new_tokens, model.label)
        if why:
            raise UsageError(f"generation.max_new_tokens: {why}")
        _check_engine_lengths(jobs, model, positions, longest, max_new_tokens)


def _check_engine_lengths(jobs: list[JobSpec], model, positions: int, longest: int, max_new_tokens: int) -> None:
    """An engine's max_model_len (vLLM) within the model's positions, and every generation within it."""
    from worker.core import policy

    lengths = {j.engine.max_model_len for j in jobs if j.model.path == model.path and j.engine is not None}
    for length in sorted(x for x in lengths if x is not None):
        if length > positions:
            raise UsageError(f"engines: max_model_len {length} is beyond model {model.label}'s {positions} positions")
        why = policy.context_refusal(length, longest, max_new_tokens, f"{model.label} (max_model_len)")
        if why:
            raise UsageError(f"engines.max_model_len: {why}")
