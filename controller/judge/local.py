"""A local-model judge: the report loads `judge.local` itself and decodes greedily with the own engine.

Each request's chat messages become one plain-text prompt (system, a blank line, user, a blank line,
"Verdict:"): the bundled models have no chat template, and a model that has one is still asked the
same text, so its verdicts are comparable across models. The prompts run as one greedy job through
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
    """Each body's reply from the local model, greedy, at most `judge.max_new_tokens` new tokens."""
    from worker.core import settings
    from worker.core.contract import GenerationSettings, JobSpec, PromptItem, StrategySpec
    from worker.engine.job import EngineSettings, Runtime, generate_job  # the engine, only for a local judge

    prompts = [PromptItem(id=f"j{i:06d}", prompt=chat_text(b["messages"])) for i, b in enumerate(bodies)]
    digest = hashlib.sha256("".join(p.prompt for p in prompts).encode()).hexdigest()[:16]
    job = JobSpec(
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
    runtime = Runtime(settings.get("device") or "cpu", EngineSettings.from_environment())
    _, records = generate_job(job, runtime)
    by_id = {r.prompt_id: r for r in records}
    return [(by_id[p.id].text, by_id[p.id].n_new_tokens) if p.id in by_id else (None, "no generation") for p in prompts]
