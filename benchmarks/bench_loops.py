"""Contrastive search's loops and steps against each other, side by side.

Four ways to run the same contrastive-search job (k = 4, alpha = 0.6, batch 16), interleaved,
5 rounds (odd rounds reversed), on the mixed and on the uniform prompts of bench_throughput.py,
without a stop string and with ".":

- own: the default, contrastive search as a step of the engine's own loop (worker.engine.decode:
  compaction, continuous refill, a row's k candidates as k tokens over the row's own cache);
- own_batches: the same with `refill: false` (batch after batch, compaction only);
- loop_shared: the strategy's own batch loop (worker.engine.loops.contrastive:generate) with
  the same shared-cache step;
- loop_repeated: that loop with the original step, which repeats the cache k times and
  selects the winners' rows back (the prepared mask refused).

Printed ratios (medians of the rounds' ratios, > 1 where the first side is faster):
own_vs_loop (own / loop_shared: what the own loop adds), refill_vs_batches (own /
own_batches) and shared_vs_repeated (loop_shared / loop_repeated: the step alone). The
outputs of all four sides are checked identical.

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
from worker.engine.loops.contrastive import runs_in_own_loop  # noqa: E402


def side(runtime, spec, way: str):
    """A run of the job one of the four ways (see the module's docstring)."""

    def run():
        if way == "loop_shared":
            contrastive.runs_in_own_loop = lambda model, config: False
        if way == "loop_repeated":
            contrastive.prepared_mask = lambda model: False
        try:
            result, records = generate_job(batches if way == "own_batches" else spec, runtime)
        finally:
            contrastive.prepared_mask, contrastive.runs_in_own_loop = prepared_mask, runs_in_own_loop
        return result.new_tokens, [r.token_ids for r in records]

    batches = spec.model_copy(update={"generation": spec.generation.model_copy(update={"refill": False})})
    return run


WAYS = ("own", "own_batches", "loop_shared", "loop_repeated")
PAIRS = {
    "own_vs_loop": ("own", "loop_shared"),
    "refill_vs_batches": ("own", "own_batches"),
    "shared_vs_repeated": ("loop_shared", "loop_repeated"),
}


def compare(runtime, label: str, spec, n_rounds: int) -> dict:
    stats, outputs = rounds({way: side(runtime, spec, way) for way in WAYS}, n_rounds, runtime.device)
    same = sum(all(o == outputs["own"][i] for o in (outputs[w][i] for w in WAYS)) for i in range(len(outputs["own"])))
    ratios = {name: ratio(stats[a], stats[b]) for name, (a, b) in PAIRS.items()}
    rates = "   ".join(f"{way} {stats[way]['tokens_per_s']:7.1f}" for way in WAYS)
    print(
        f"{label:20s} {rates} tok/s   "
        + "   ".join(f"{name} x{r:.2f}" for name, r in ratios.items())
        + f"   identical {same}/{len(outputs['own'])}"
    )
    return {**ratios, **stats, "identical_outputs": f"{same}/{len(outputs['own'])}"}


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
            compare(runtime, name + (f" stop {stop[0]!r}" if stop else ""), spec, args.rounds)


if __name__ == "__main__":
    main()
