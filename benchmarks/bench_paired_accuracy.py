"""Calibration of the paired tests of task accuracy where two cells have unequal generations a prompt.

    python benchmarks/bench_paired_accuracy.py                          # 8 samples against 1, the null, 32 prompts
    python benchmarks/bench_paired_accuracy.py --unequal 8 3 --effect 0 0.1 --sims 500
    python benchmarks/bench_paired_accuracy.py --unequal 3 1 --prompts 16 32 --beta 1 1

A task process of its own (not `bench_paired.py`'s texts): prompt i is answered right with probability p_i, drawn
from Beta(a, b) (`--beta`; the default 0.5, 0.5 puts most prompts near always or never right, as a task's easy and
hard items); cell A draws K_A answers a prompt, B K_B (`--unequal`: 8 samples against greedy's one), each right
with p_i, B's with p_i + effect (capped at 1; `--effect 0`: the null, both cells the same process). A right
generation's text is the prompt's gold answer, a wrong one another number, so `exact_match`, `pass@1` and (where
both cells have 3 a prompt) `pass@3` are the registered metrics read by the sweep's task (`last_number`), kept by
the report's own `cells.score` (`bench_paired.stats_of`) and compared by its `paired.compare_pair`.

Printed for each metric: how often "no difference" is rejected at p < 0.05 (under the null the test's size, at
most about 5% for a valid test; under an effect its power) and how often the paired interval covers 0.

pass@1 of K samples is exact_match's share prompt by prompt, so their tests should agree: until 2026-12-07 pass@1's
per-prompt sums (c / K, 1) were divided by the K generations again, and its test rejected a true null in 0.0% of
simulations at 8 v 1 (docs/reports.md, "Cells with unequal generations a prompt").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_paired import stats_of
from controller.metrics import METRICS, cell_data
from controller.report.stats.paired import compare_pair


def task_cell(right: np.ndarray, gold: list[str]):
    """A cell of one row of `right` (prompts, generations) booleans: texts '#<gold>' or '#<wrong>'."""
    records = [
        {"text": f"#{gold[i] if ok else int(gold[i]) + 1000}", "prompt_id": f"p{i}", "seed": j, "answer": gold[i]}
        for i, row in enumerate(right)
        for j, ok in enumerate(row)
    ]
    cell = cell_data(records)
    cell.task = {"extract": ["last_number"]}
    groups = [list(range(i * right.shape[1], (i + 1) * right.shape[1])) for i in range(len(right))]
    return cell, groups


def simulate(G: int, ka: int, kb: int, effect: float, beta: tuple[float, float], sim: int, names: list[str]) -> dict:
    rng = np.random.default_rng([G, ka, kb, int(effect * 1000), sim])
    p = rng.beta(*beta, size=G)
    gold = [str(100 + i) for i in range(G)]
    a = rng.random((G, ka)) < p[:, None]
    b = rng.random((G, kb)) < np.minimum(1.0, p + effect)[:, None]
    stats = [stats_of(name, *task_cell(right, gold), names) for name, right in (("A", a), ("B", b))]
    return compare_pair(*stats, {m: METRICS.get(m) for m in names}, n_boot=1000, rng=np.random.default_rng(sim))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0, help="the first simulation (a second run: --start 1000)")
    ap.add_argument("--prompts", type=int, nargs="*", default=[32])
    ap.add_argument("--unequal", type=int, nargs=2, metavar=("K_A", "K_B"), default=[8, 1])
    ap.add_argument("--effect", type=float, nargs="*", default=[0.0])
    ap.add_argument("--beta", type=float, nargs=2, metavar=("A", "B"), default=[0.5, 0.5])
    args = ap.parse_args()
    ka, kb = args.unequal
    if min(ka, kb) < 1:
        ap.error("--unequal: each cell needs at least 1 generation a prompt")
    names = ["exact_match", "pass@1"] + (["pass@3"] if min(ka, kb) >= 3 else [])
    for G in args.prompts:
        for effect in args.effect:
            t0 = time.perf_counter()
            rejected, covered = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
            for sim in range(args.start, args.start + args.sims):
                out = simulate(G, ka, kb, effect, tuple(args.beta), sim, names)
                for m in names:
                    rejected[m] += out[f"{m}_diff_p"] < 0.05
                    covered[m] += out[f"{m}_diff_ci_low"] <= 0 <= out[f"{m}_diff_ci_high"]
            n = args.sims
            cells = "  ".join(
                f"{m}: p < 0.05 {100 * rejected[m] / n:.1f}%, interval covers 0 {100 * covered[m] / n:.1f}%"
                for m in names
            )
            print(
                f"{ka} v {kb}, {G} prompts, Beta{tuple(args.beta)}, effect {effect}, {args.sims} simulations "
                f"({time.perf_counter() - t0:.0f} s): {cells}",
                flush=True,
            )


if __name__ == "__main__":
    main()
