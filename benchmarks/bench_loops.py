"""The strategies' steps in the engine's own loop against their batch loops, side by side.

Contrastive search (k = 4, alpha = 0.6, batch 16), four ways:

- own: the default, a step of the engine's own loop (worker.engine.decode: compaction,
  continuous refill, a row's k candidates as k tokens over the row's own cache);
- own_batches: the same with `refill: false` (batch after batch, compaction only);
- loop_shared: the strategy's batch loop (worker.engine.loops.contrastive:generate) with the
  same shared-cache step;
- loop_repeated: that loop with the original step, which repeats the cache k times and
  selects the winners' rows back (the prepared mask refused).

Beam search (4 beams, batch 8 prompts), three ways: own (loops.beam_step in the own loop,
with refill), own_batches, and loop (the batch loop, worker.engine.loops.beam:generate).

Every set runs interleaved, 5 rounds (odd rounds reversed), on the mixed and the uniform
prompts of bench_throughput.py, without a stop string and with one ("." for contrastive
search; "," and "." for beam search). Printed ratios are medians of the rounds' ratios, > 1
where the first side is faster: own_vs_loop (what the own loop adds), refill_vs_batches and,
for contrastive search, shared_vs_repeated (the step alone). The outputs of every side are
checked identical.

    python benchmarks/bench_loops.py [--model M] [--prompts 32] [--new 48] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.jobs import job  # noqa: E402
from benchmarks.sides import mixed_prompts, ratio, rounds, uniform_prompts  # noqa: E402
from worker.core.contract import ModelSpec  # noqa: E402
from worker.core.logs import configure  # noqa: E402
from worker.engine import plan as planning  # noqa: E402
from worker.engine.job import Runtime, generate_job  # noqa: E402
from worker.engine.loops import contrastive  # noqa: E402
from worker.strategies import Kind  # noqa: E402

decode_step, prepared_mask, runs_in_decode_loop = (
    planning.decode_step,
    planning.prepared_mask,
    contrastive.runs_in_decode_loop,
)


def side(runtime, spec, way: str):
    """A run of the job one of the ways (see the module's docstring)."""

    def run():
        if way == "loop_shared":
            contrastive.runs_in_decode_loop = lambda config, mask: False
        if way == "loop_repeated":
            planning.prepared_mask = lambda model: False
        if way == "loop":
            beams = (Kind.BEAM, Kind.DIVERSE_BEAM)
            planning.decode_step = lambda lm, kind, cfg: None if kind in beams else decode_step(lm, kind, cfg)
        try:
            result, records = generate_job(batches if way == "own_batches" else spec, runtime)
        finally:
            planning.prepared_mask, planning.decode_step = prepared_mask, decode_step
            contrastive.runs_in_decode_loop = runs_in_decode_loop
        return result.new_tokens, [r.token_ids for r in records]

    batches = spec.model_copy(update={"generation": spec.generation.model_copy(update={"refill": False})})
    return run


FAMILIES = {
    "contrastive": (
        ("own", "own_batches", "loop_shared", "loop_repeated"),
        {
            "own_vs_loop": ("own", "loop_shared"),
            "refill_vs_batches": ("own", "own_batches"),
            "shared_vs_repeated": ("loop_shared", "loop_repeated"),
        },
    ),
    "beam": (
        ("own", "own_batches", "loop"),
        {"own_vs_loop": ("own", "loop"), "refill_vs_batches": ("own", "own_batches")},
    ),
}


def compare(runtime, label: str, spec, family: str, n_rounds: int) -> dict:
    ways, pairs = FAMILIES[family]
    stats, outputs = rounds({way: side(runtime, spec, way) for way in ways}, n_rounds, runtime.device)
    same = sum(all(o == outputs["own"][i] for o in (outputs[w][i] for w in ways)) for i in range(len(outputs["own"])))
    ratios = {name: ratio(stats[a], stats[b]) for name, (a, b) in pairs.items()}
    rates = "   ".join(f"{way} {stats[way]['tokens_per_s']:7.1f}" for way in ways)
    print(
        f"{label:32s} {rates} tok/s   "
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
    print(f"model {args.model}, {args.prompts} prompts x {args.new} new tokens, {args.rounds} rounds")
    sets = {"mixed": mixed_prompts(lm.tokenizer, args.prompts), "uniform": uniform_prompts(args.prompts)}
    jobs = [
        ("contrastive", {"k": 4, "alpha": 0.6}, 16, ((), (".",))),
        ("beam", {"num_beams": 4}, 8, ((), (",",), (".",))),
    ]
    for family, params, batch, stops in jobs:
        for name, prompts in sets.items():
            for stop in stops:
                spec = job(args.model, prompts, family, params, batch_size=batch, max_new=args.new, stop=stop)
                label = f"{family} {name}" + (f" stop {stop[0]!r}" if stop else "")
                compare(runtime, label, spec, family, args.rounds)


if __name__ == "__main__":
    main()
