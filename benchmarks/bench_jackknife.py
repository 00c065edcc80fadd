"""The jackknife metrics' exact leave-one-out values against recomputing the metric without each prompt.

    python benchmarks/bench_jackknife.py                         # 100 and 1,000 prompts x 3 seeds of 64 words
    python benchmarks/bench_jackknife.py --prompts 300 --seeds 1 --recount 50

A cell's interval for a plain corpus metric (distinct-n, self-BLEU, zipf) needs the metric without each prompt
in turn. Each declares an exact `leave_one_out` (controller/metrics/); without it the report would compute the
metric on the cell without each prompt (`intervals.recomputed`, the fallback: a plugin metric's path), G
recomputations of a cell, so time ∝ G². Side by side on the same synthetic cell (bench_self_bleu's Zipf-ish
words): one evaluation of the metric, the exact values for every prompt, and the recomputation, timed on the first
`--recount` prompts and projected to all G (it is the same work for each); the script asserts that both give the
same values on those prompts, bit for bit. CPU seconds of this process (single-threaded pure Python).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ beside it

from benchmarks.bench_self_bleu import synthetic
from controller.metrics import METRICS, CellData
from controller.report.stats.intervals import recomputed

NAMES = ("distinct_2", "self_bleu_4", "zipf")


def side_by_side(metric, cell: CellData, groups: list[list[int]], k: int) -> tuple[float, float, float]:
    """CPU seconds of one value, the exact leave-one-out values, and recomputing the first k; equal asserted."""
    start = time.process_time()
    metric.fn(cell)
    one = time.process_time() - start
    start = time.process_time()
    exact = np.asarray(metric.leave_one_out(cell, groups), dtype=float)
    t_exact = time.process_time() - start
    start = time.process_time()
    again = recomputed(metric, cell, groups, range(k))
    t_again = time.process_time() - start
    assert np.array_equal(exact[:k], again, equal_nan=True), f"{metric.name}: differs from recomputing"
    return one, t_exact, t_again


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--seeds", type=int, default=3, help="generations per prompt")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--recount", type=int, default=20, help="prompts the recomputation is timed on (default 20)")
    args = ap.parse_args(argv)
    print(f"jackknife leave-one-out, {args.seeds} generation(s) of {args.tokens} words a prompt; CPU seconds")
    for G in args.prompts:
        docs = synthetic(G * args.seeds, args.tokens, 5000, 0)
        cell = CellData(texts=[" ".join(d) for d in docs], words=docs)
        groups = [list(range(g * args.seeds, (g + 1) * args.seeds)) for g in range(G)]
        k = min(args.recount, G)
        for name in NAMES:
            one, t_exact, t_again = side_by_side(METRICS.get(name), cell, groups, k)
            projected = t_again * G / k
            print(f"{G:5d} prompts  {name:12s} one value {one:7.3f} s   exact leave-one-out {t_exact:7.3f} s "
                  f"({t_exact / one:4.1f}x one)   recomputing {projected:8.2f} s (projected from {k})   "
                  f"recomputing / exact {projected / t_exact:6.0f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
