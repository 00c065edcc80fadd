"""The one-shard JobSpec every throughput benchmark runs (bench_throughput.py and its GPU section)."""

from __future__ import annotations

from worker.core.contract import GenerationSettings, JobSpec, ModelSpec, StrategySpec


def job(
    model: str, prompts, strategy="greedy", params=None, batch_size=16, max_new=48, stop=(), min_new=0, **more
) -> JobSpec:
    """A one-shard benchmark job; `more`: dtype (default auto) and warmup (default False)."""
    gen = GenerationSettings(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        batch_size=batch_size,
        stop=list(stop),
        warmup=more.get("warmup", False),
    )
    return JobSpec(
        tenant="bench",
        sweep_id="bench",
        sweep_name="bench",
        job_id=f"bench-{strategy}-{batch_size}",
        cell="bench",
        model=ModelSpec(path=model, dtype=more.get("dtype", "auto")),
        strategy=StrategySpec(name=strategy, params=params or {}),
        seed=0,
        shard=0,
        n_shards=1,
        prompts=prompts,
        generation=gen,
        metrics=["distinct_1"],
        # Generation only, as the hand-written loops: no scoring, no features. The planner writes
        # `compute` from the metrics; a JobSpec built by hand gets the default (both), and from c6a6952
        # to this fix every benchmark timed a perplexity pass per job on the own engine's side
        # (docs/performance.md, "The regression of c6a6952").
        compute=[],
    )
