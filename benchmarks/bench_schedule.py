"""What the engine's schedule alone can gain over the generate() loop on the mixed prompts.

`vs_generate_mixed` (bench_throughput.py) times both sides whole. This script separates
the schedule from the loop: it records the engine's own schedule on that prompt set (the
live rows and columns of every decode step, the shape of every prefill), does the same
for the hand-written generate() loop's (batches in the given order, every row until its
batch is done), and costs both with the model's measured forward times, the same
function for both sides. The ratio of the two costs is what the engine's schedule is
worth at this model's cost per step, before either side's loop overhead: if
`vs_generate_mixed` is near it, the rest is not in the loop but in the cost of a step.

    python benchmarks/bench_schedule.py [--model M] [--prompts 32] [--new 48] [--batch 16] [--stop .] [--rounds 15]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_throughput import hand_generate  # noqa: E402
from benchmarks.jobs import job  # noqa: E402
from benchmarks.sides import mixed_prompts  # noqa: E402
from worker.core.contract import ModelSpec  # noqa: E402
from worker.core.logs import configure  # noqa: E402
from worker.engine.call import ModelCall  # noqa: E402
from worker.engine.job import Runtime, generate_job  # noqa: E402


def engine_schedule(runtime, spec) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """One engine run's decode steps (live rows, columns) and prefills (rows, width), recorded."""
    steps: list[tuple[int, int]] = []
    prefills: list[tuple[int, int]] = []
    forward, prefill = ModelCall.forward, ModelCall.prefill

    def recorded_forward(self, rows, cache):
        steps.append((rows.live.numel(), rows.width))
        return forward(self, rows, cache)

    def recorded_prefill(self, rows, cache, **more):
        prefills.append(tuple(rows.ids.shape))
        return prefill(self, rows, cache, **more)

    ModelCall.forward, ModelCall.prefill = recorded_forward, recorded_prefill
    try:
        generate_job(spec, runtime)
    finally:
        ModelCall.forward, ModelCall.prefill = forward, prefill
    return steps, prefills


def generate_schedule(lm, prompts, batch: int, max_new: int, stop) -> tuple[list, list]:
    """The generate() loop's: per batch, its prefill and one step of all its rows until the batch is done."""
    steps, prefills = [], []
    for i in range(0, len(prompts), batch):
        part = prompts[i : i + batch]
        width = lm.tokenizer([p.prompt for p in part], return_tensors="pt", padding=True)["input_ids"].shape[1]
        run = hand_generate(lm, part, batch, max_new, stop=stop)
        run()
        new_columns = run.row_steps // len(part)  # the batch's steps: the first token comes from the prefill
        prefills.append((len(part), width))
        steps += [(len(part), width + 1 + t) for t in range(new_columns - 1)]
    return steps, prefills


class Costs:
    """The model's forward times: a decode step of r rows over w cached columns (w rounded to 8), a prefill.

    Every shape either schedule needs is timed once per round, in a new random order each
    round, and each shape's cost is its fastest time (the uncontended cost; on a shared
    machine a median still carries the neighbours' load): the two schedules are costed by
    the same function, and a machine that slows down during the run moves every shape alike."""

    def __init__(self, model, rounds: int) -> None:
        self.model, self.rounds = model, rounds
        self.memo: dict[tuple, float] = {}

    @staticmethod
    def keys(schedule) -> list[tuple]:
        steps, prefills = schedule
        return [("step", r, 8 * round(w / 8)) for r, w in steps] + [("prefill", r, w) for r, w in prefills]

    def measure(self, *schedules) -> None:
        shapes = sorted({k for s in schedules for k in self.keys(s)})
        times: dict[tuple, list[float]] = {k: [] for k in shapes}
        order = random.Random(0)
        with torch.inference_mode():
            for _ in range(self.rounds):
                for key in order.sample(shapes, len(shapes)):
                    times[key].append(self._time(*key))
        self.memo = {k: min(v) for k, v in times.items()}

    def _time(self, kind: str, rows: int, width: int) -> float:
        ids = torch.randint(1, self.model.config.vocab_size, (rows, width))
        if kind == "prefill":
            start = time.perf_counter()
            self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
            return time.perf_counter() - start
        cache = self.model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
        start = time.perf_counter()
        self.model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
        return time.perf_counter() - start

    def of(self, schedule) -> float:
        return sum(self.memo[k] for k in self.keys(schedule))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "examples/models/austen-small"))
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--stop", default=".")
    ap.add_argument("--rounds", type=int, default=15, help="times each forward shape is timed (fastest kept)")
    args = ap.parse_args()
    configure(level="warning")
    runtime = Runtime("cpu")
    lm = runtime.cache.get(ModelSpec(path=args.model), runtime.device)
    prompts = mixed_prompts(lm.tokenizer, args.prompts)
    stop = (args.stop,) if args.stop else ()
    ours = engine_schedule(runtime, job(args.model, prompts, batch_size=args.batch, max_new=args.new, stop=stop))
    theirs = generate_schedule(lm, prompts, args.batch, args.new, stop)
    costs = Costs(lm.model, args.rounds)
    costs.measure(ours, theirs)
    a, b = costs.of(ours), costs.of(theirs)
    for name, (steps, prefills), ms in (("decodebench", ours, a), ("generate() loop", theirs, b)):
        row_steps = sum(r for r, _ in steps)
        shape = f"{len(steps):4d} decode steps, {row_steps:5d} row-steps, prefills {prefills}"
        print(f"{name:16s} {shape}: {ms * 1000:7.1f} ms")
    small = min((k for k in costs.memo if k[0] == "step"), key=lambda k: k[1])
    big = max((k for k in costs.memo if k[0] == "step"), key=lambda k: k[1])
    print(
        f"a decode step: {costs.memo[small] * 1000:.2f} ms at {small[1]} rows over {small[2]} columns, "
        f"{costs.memo[big] * 1000:.2f} ms at {big[1]} rows over {big[2]}"
    )
    print(f"schedule bound (generate() loop's cost / decodebench's): x{b / a:.3f}")


if __name__ == "__main__":
    main()
