"""The strategies' steps in the engine's own loop, over each cache the plan can choose, side by side.

Contrastive search (k = 4, alpha = 0.6, batch 16), three ways:

- own: the default, the step in the engine's decode loop (worker.engine.decode: compaction,
  continuous refill, a row's k candidates as k tokens over the row's own preallocated cache);
- own_batches: the same with `refill: false` (batch after batch, compaction only);
- repeated: the plan where the prepared mask is refused: the same step, its candidates over
  transformers' cache repeated k times, the winners' rows selected back (batches).

Beam search (4 beams, batch 8 prompts), three ways: own (loops.beam_step over the preallocated
cache, with refill), own_batches, and dynamic (the same step in batches over transformers' own
cache: the plan for a model whose layers do not take the preallocated one).

Every set runs interleaved, 5 rounds (odd rounds reversed), on the mixed and the uniform
prompts of bench_throughput.py, without a stop string and with one ("." for contrastive
search; "," and "." for beam search). Printed ratios are medians of the rounds' ratios, > 1
where the first side is faster: refill_vs_batches (what refill adds), shared_vs_repeated
(contrastive search's candidate pass, both in batches) and preallocated_vs_dynamic (beam search's
cache, both in batches). The outputs of every side are checked identical.

    python benchmarks/bench_loops.py [--model M] [--prompts 32] [--new 48] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
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


def _dynamic(probes):
    """The model's probes with the preallocated cache refused (transformers' own cache is planned)."""
    return lambda model: dataclasses.replace(probes(model), preallocated=False)


PLANS = {  # way -> the plan's probes it patches: (name, replacement)
    "repeated": (("prepared_mask", lambda real: lambda model: False),),
    "dynamic": (("prepared_mask", lambda real: lambda model: False), ("probes", _dynamic)),
}


def side(runtime, spec, way: str):
    """A run of the job one of the ways (see the module's docstring)."""
    batches = spec.model_copy(update={"generation": spec.generation.model_copy(update={"refill": False})})

    def run():
        saved = {name: getattr(planning, name) for name, _ in PLANS.get(way, ())}
        for name, patch in PLANS.get(way, ()):
            setattr(planning, name, patch(saved[name]))
        try:
            result, records = generate_job(spec if way == "own" else batches, runtime)
        finally:
            for name, real in saved.items():
                setattr(planning, name, real)
        return result.new_tokens, [r.token_ids for r in records]

    return run


FAMILIES = {
    "contrastive": (
        ("own", "own_batches", "repeated"),
        {"refill_vs_batches": ("own", "own_batches"), "shared_vs_repeated": ("own_batches", "repeated")},
    ),
    "beam": (
        ("own", "own_batches", "dynamic"),
        {"refill_vs_batches": ("own", "own_batches"), "preallocated_vs_dynamic": ("own_batches", "dynamic")},
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
