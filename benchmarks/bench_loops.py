"""Contrastive search's shared-cache step against the original repeated-cache step, side by side.

contrastive_shared_vs_repeated: contrastive search with a row's k candidates run as k tokens
of that row over its own cache, against the original step that repeats the cache k times and
selects the winners' rows back (the same loop with the prepared mask refused, so the two
sides differ in that step only). Both run interleaved, 5 rounds (odd rounds reversed), on
the mixed and on the uniform prompts of bench_throughput.py, without a stop string and with
".". A ratio is the median of the rounds' ratios, > 1 where the shared step is faster; the
outputs of the two sides are checked identical. (The compaction figures in
docs/performance.md were measured against the loops of earlier commits, named there.)

    python benchmarks/bench_loops.py [--model M] [--prompts 32] [--new 48] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_throughput import mixed_prompts, ratio, rounds, uniform_prompts  # noqa: E402
from benchmarks.jobs import job  # noqa: E402
from worker.core.contract import ModelSpec  # noqa: E402
from worker.core.logs import configure  # noqa: E402
from worker.engine.decode import prepared_mask  # noqa: E402
from worker.engine.job import Runtime, generate_job  # noqa: E402
from worker.engine.loops import contrastive  # noqa: E402


def side(runtime, spec, shared: bool):
    """A run of the job with contrastive search's shared-cache step on or off."""

    def run():
        contrastive.prepared_mask = prepared_mask if shared else (lambda model: False)
        try:
            result, records = generate_job(spec, runtime)
        finally:
            contrastive.prepared_mask = prepared_mask
        return result.new_tokens, [r.token_ids for r in records]

    return run


def pair(runtime, name: str, fast, slow, n_rounds: int) -> dict:
    stats, outputs = rounds({"fast": fast, "slow": slow}, n_rounds, runtime.device)
    same = sum(a == b for a, b in zip(outputs["fast"], outputs["slow"]))
    r = ratio(stats["fast"], stats["slow"])
    print(
        f"{name:32s} on {stats['fast']['tokens_per_s']:8.1f} tok/s   off {stats['slow']['tokens_per_s']:8.1f} tok/s"
        f"   x{r:.2f}   identical {same}/{len(outputs['fast'])}"
    )
    return {"ratio": r, **stats, "identical_outputs": f"{same}/{len(outputs['fast'])}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "examples/models/austen-small"))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    configure(level="warning")
    runtime = Runtime("cpu")
    lm = runtime.cache.get(ModelSpec(path=args.model), runtime.device)
    prompts = mixed_prompts(lm.tokenizer, args.prompts)
    params = {"k": 4, "alpha": 0.6}
    print(f"model {args.model}, {args.prompts} prompts x {args.new} new tokens, batch 16, {args.rounds} rounds")
    sets = {"mixed": mixed_prompts(lm.tokenizer, args.prompts), "uniform": uniform_prompts(args.prompts)}
    for name, prompts in sets.items():
        for stop in ((), (".",)):
            spec = job(args.model, prompts, "contrastive", params, batch_size=16, max_new=args.new, stop=stop)
            label = f"shared_vs_repeated {name}" + (f" stop {stop[0]!r}" if stop else "")
            pair(runtime, label, side(runtime, spec, True), side(runtime, spec, False), args.rounds)


if __name__ == "__main__":
    main()
