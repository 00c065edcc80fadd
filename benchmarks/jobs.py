"""The one-shard JobSpec every throughput benchmark runs (bench_throughput.py and its GPU section)."""

from __future__ import annotations

from controller.metrics.registry import worker_needs
from worker.core.contract import GenerationSettings, JobSpec, ModelSpec, StrategySpec

METRICS = ["distinct_1"]  # a metric computed from the texts alone: the job only generates


def job(
    model: str, prompts, strategy="greedy", params=None, batch_size=16, max_new=48, stop=(), min_new=0, **more
) -> JobSpec:
    """A one-shard benchmark job; `more`: dtype (default auto), warmup (default False) and decode_step (auto)."""
    gen = GenerationSettings(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        batch_size=batch_size,
        stop=list(stop),
        warmup=more.get("warmup", False),
        decode_step=more.get("decode_step", "auto"),
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
        metrics=METRICS,
        # What the metrics need, as the planner writes it (for distinct_1: nothing, generation only, as the
        # hand-written loops). A JobSpec built without it gets the default (score and featurize): from
        # c6a6952 to 2c2463d every benchmark timed a perplexity pass per job on the own engine's side
        # (docs/performance.md, "The regression of c6a6952").
        compute=worker_needs(METRICS),
    )
