"""A local-model judge: the report loads `judge.local` itself and decodes greedily with the own engine.

A chat model (`chat: auto` finding its template, or `chat: true`) is asked each request's messages, system and
user turns as they are, through its own template, as an OpenAI-compatible server asks the same model at a `url`.
A model without a template (the bundled austen-tiny) gets them as one plain-text prompt (system, a blank line,
user, a blank line, "Verdict:"). The prompts run as one greedy job through
`worker.engine.job.generate_job` (the same engine, batching and stopping as every cell; nothing is
written to the store but the replies, cached like an endpoint's). torch is imported only here, inside
the call: the controller never imports it at module level (as controller.launch.local hosts the engine).
"""

from __future__ import annotations

import hashlib

from controller.judge.client import Reply


def chat_text(messages: list[dict[str, str]]) -> str:
    return "\n\n".join(m["content"] for m in messages) + "\n\nVerdict:"


def complete_local(judge, bodies: list[dict]) -> list[Reply]:
    """Each body's reply from the local model, greedy, at most `judge.max_new_tokens` new tokens; a request whose
    prompt and new tokens do not fit the model's positions is a failed reply naming them (as an endpoint's 4xx
    would be), not an error that stops the report."""
    from worker.core import settings
    from worker.core.contract import PromptItem
    from worker.core.policy import context_refusal, model_positions
    from worker.engine import chat
    from worker.engine.job import EngineSettings, Runtime, generate_job  # the engine, only for a local judge

    prompts = [PromptItem(id=f"j{i:06d}", prompt=chat_text(b["messages"])) for i, b in enumerate(bodies)]
    runtime = Runtime(settings.get("device") or "cpu", EngineSettings.from_environment())
    lm = runtime.cache.get(judge.local, runtime.device)  # generate_job takes it from the same cache
    job = _job(judge, prompts)
    if chat.is_chat(lm.tokenizer, job):  # the messages through the model's template
        prompts = [PromptItem(id=p.id, prompt=p.prompt, messages=b["messages"]) for p, b in zip(prompts, bodies)]
        job = _job(judge, prompts)
    positions = model_positions(lm.model.config.to_dict())
    lengths = {i: len(ids) for i, ids in chat.encoded(lm.tokenizer, job).ids.items()}
    too_long = {
        i: f"too long for the judge: {n} tokens plus judge.max_new_tokens {judge.max_new_tokens} is over the "
        f"{positions} positions of model {judge.local.label!r} (a judge of a longer context, a shorter template or "
        "shorter answers)"
        for i, n in lengths.items()
        if context_refusal(positions, n, judge.max_new_tokens, judge.local.label)  # the engine's rule
    }
    fitting = [p for p in prompts if p.id not in too_long]
    by_id = {r.prompt_id: r for r in (generate_job(_job(judge, fitting), runtime)[1] if fitting else [])}
    return [
        (by_id[p.id].text, by_id[p.id].n_new_tokens) if p.id in by_id else (None, too_long.get(p.id, "no generation"))
        for p in prompts
    ]


def _job(judge, prompts):
    """One greedy job of the judge's prompts, named by their digest (nothing of it reaches the store)."""
    from worker.core.contract import GenerationSettings, JobSpec, StrategySpec

    digest = hashlib.sha256("".join(p.prompt for p in prompts).encode()).hexdigest()[:16]
    return JobSpec(
        tenant="default",
        sweep_id=digest,
        sweep_name="judge",
        job_id=digest,
        cell="judge",
        model=judge.local,
        strategy=StrategySpec(name="greedy", params={}),
        seed=0,
        shard=0,
        n_shards=1,
        prompts=prompts,
        generation=GenerationSettings(max_new_tokens=judge.max_new_tokens, batch_size=min(8, len(prompts))),
        compute=[],
    )
