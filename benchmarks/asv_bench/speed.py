"""airspeed velocity's suite: the own engine's speed at each commit, for `make bench-compare`.

asv installs each measured commit's checkout editable (benchmarks/asv.conf.json), so this suite runs
that commit's own harness (benchmarks/bench_throughput.py, benchmarks/jobs.py) on that commit's
bundled models: whatever the commit's benchmark would have printed is what asv records and compares.
A harness change that moves the figures is flagged like an engine change; that is how the regression
of c6a6952 (docs/performance.md) would have been seen the day it landed.

asv counts a larger value as worse, so every figure here is a time:

- `Ratios.track_*`: the own engine's time divided by its peer's on the same work (the inverse of
  bench_throughput's ratios: 0.85 there is 1.18 here), each the median of interleaved rounds in one
  process, as bench_throughput computes them;
- `Engine.time_*`: one job of the own engine (32 held-out prompts x 48 new tokens, batch 16) on each
  bundled model, uniform prompts and the ragged ones (stop string ","): its tokens/s is the job's
  new tokens over this time (benchmarks/README.md prints both).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys
from pathlib import Path

# The workload (bench_throughput's defaults); tests/repo/test_bench_compare.py runs the suite at a smoke size.
PROMPTS, NEW, BATCH, BEAM_BATCH = 32, 48, 16, 8
ROUNDS = 3  # bench_throughput's interleaved rounds per ratio inside one asv sample


def tree() -> Path:
    """The measured commit's checkout (asv installs it editable), or the suite cannot run there."""
    import worker

    root = Path(worker.__file__).resolve().parents[1]
    if not (root / "benchmarks" / "jobs.py").is_file():
        raise NotImplementedError(f"{root} has no benchmarks/jobs.py: a commit before the harness")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return root


def harness():
    """The commit's bench_throughput module (its job builder, sections and prompts)."""
    tree()
    return importlib.import_module("benchmarks.bench_throughput")


class Ratios:
    """bench_throughput's key ratios at the commit, as own-engine time over peer time."""

    timeout = 900
    rounds = 2  # asv samples per commit (with --interleave-rounds, one per round)

    def setup_cache(self) -> dict:
        bt = harness()
        model = str(tree() / "examples/models/austen-small")
        args = argparse.Namespace(
            model=model, device="cpu", prompts=PROMPTS, new=NEW, batch=BATCH, beam_batch=BEAM_BATCH, rounds=ROUNDS
        )
        bt.configure(level="warning")
        runtime = bt.Runtime("cpu")
        lm = runtime.cache.get(bt.ModelSpec(path=model), runtime.device)
        bt.generate_job(bt.job(model, bt.uniform_prompts(4), max_new=4), runtime)  # warm-up, as main() does
        with contextlib.redirect_stdout(io.StringIO()):
            found = {**bt.compare_generate(runtime, lm, model, args), **bt.compare_beam(runtime, lm, model, args)}
        return {key: 1 / found[key]["ratio"] for key in found}

    def track_vs_generate(self, times: dict) -> float:
        return times["vs_generate"]

    def track_vs_generate_mixed(self, times: dict) -> float:
        return times["vs_generate_mixed"]

    def track_vs_generate_ragged(self, times: dict) -> float:
        return times["vs_generate_ragged"]

    def track_beam_vs_generate(self, times: dict) -> float:
        return times["beam_vs_generate"]


for _name in ("vs_generate", "vs_generate_mixed", "vs_generate_ragged", "beam_vs_generate"):
    getattr(Ratios, f"track_{_name}").unit = "own time / generate() time"


class Engine:
    """One job of the own engine on a bundled model: uniform prompts, and ragged ones (stop ",")."""

    params = (["austen-tiny", "austen-small"], ["uniform", "ragged"])
    param_names = ["model", "prompts"]
    timeout = 600
    number = 1  # one job per timing
    repeat = (3, 7, 30.0)  # at least 3, at most 7 timings or 30 s per sample
    warmup_time = 0.0  # setup() runs the job once

    def setup(self, model: str, prompts: str) -> None:
        bt = harness()
        path = str(tree() / "examples/models" / model)
        bt.configure(level="warning")
        self.runtime = bt.Runtime("cpu")
        lm = self.runtime.cache.get(bt.ModelSpec(path=path), self.runtime.device)
        if prompts == "uniform":
            self.spec = bt.job(path, bt.uniform_prompts(PROMPTS), batch_size=BATCH, max_new=NEW)
        else:
            mixed = bt.mixed_prompts(lm.tokenizer, PROMPTS)
            self.spec = bt.job(path, mixed, batch_size=BATCH, max_new=NEW, stop=(",",))
        self.generate = bt.generate_job
        self.generate(self.spec, self.runtime)  # warm-up: the model's first calls at these shapes

    def time_job(self, model: str, prompts: str) -> None:
        self.generate(self.spec, self.runtime)
