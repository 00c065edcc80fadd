"""Coverage and width of the report's intervals of task accuracy: exact_match, pass@k and maj@k of one cell.

    python benchmarks/bench_accuracy.py                                  # 8 samples a prompt, 16 / 32 / 64 prompts
    python benchmarks/bench_accuracy.py --samples 1 --prompts 32 --beta 1 1
    python benchmarks/bench_accuracy.py --samples 8 --beta 4 0.3      # most prompts nearly always right
    python benchmarks/bench_accuracy.py --samples 3 --logit-normal 3 1.5   # the second process

The task process of `bench_paired_accuracy.py`: prompt i is answered right with probability p_i from Beta(a, b)
(`--beta`; the default 0.5, 0.5 puts most prompts near always or never right, as a task's easy and hard items), a
cell draws K answers a prompt (`--samples`), a right one the prompt's gold answer and a wrong one another number
(one wrong answer a prompt, so a majority vote is a count of the right ones). Each simulated cell goes through the
report's own `cells.score`, which gives each metric's value and its interval (the studentised bootstrap over
prompts; with one 0/1 generation a prompt the exact Clopper–Pearson interval; exact_match of several answers a
prompt Korn and Graubard's, `shares.korn_graubard`). `--logit-normal MU SIGMA`: the second process, p_i =
expit(MU + SIGMA · N(0, 1)), on which the choice of exact_match's interval was made (docs/reports.md, "Task
accuracy, measured").

The truth: each metric on a population cell of `--population` prompts drawn the same way (pass@k's estimator is
unbiased for the population's pass@k, exact_match's share of right answers for E[p]). Printed per metric: how often
the interval covers the truth, the misses with the truth above and below it, and the mean width against a normal
interval's with the true spread (2 · 1.96 · the SD of the estimates over the simulations), as bench_coverage.py.
And `betting`: exact_match's interval by Waudby-Smith and Ramdas's hedged capital from its prompts' shares, valid at
any size, measured against the report's where a few hard prompts carry the misses (docs/reports.md, "Task accuracy,
measured": not taken); and `kg-df`: Korn and Graubard's with their degrees-of-freedom shrinkage (not taken).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_paired_accuracy import task_cell
from controller.metrics import METRICS
from controller.report.compute.cells import Settings, score
from controller.report.stats.intervals import evaluate
from controller.report.stats.shares import korn_graubard


def names_for(k: int) -> list[str]:
    """exact_match, and where a prompt has several answers pass@1, pass@k and maj@k."""
    return ["exact_match"] + ([] if k == 1 else ["pass@1", f"pass@{k}", f"maj@{k}"])


def draw(G: int, k: int, beta: tuple[float, float], rng: np.random.Generator, logit: tuple[float, float] | None = None):
    """A cell of G prompts × k answers. The gold answers have 7 digits, as their wrong ones (gold + 1000), so a tie
    of a majority vote (4 right of 8) goes the same way in every prompt, of a cell as of the population: to the
    first in code-point order, the gold one. `logit` (μ, σ): the second process, p_i = expit(μ + σ·ε), ε ~ N(0, 1),
    in place of Beta(a, b)."""
    p = rng.beta(*beta, size=G) if logit is None else 1 / (1 + np.exp(-(logit[0] + logit[1] * rng.standard_normal(G))))
    return task_cell(rng.random((G, k)) < p[:, None], [str(10**6 + i) for i in range(G)])


def betting(x: np.ndarray, rng: np.random.Generator, level: float = 0.95, c: float = 0.5) -> tuple[float, float]:
    """Waudby-Smith and Ramdas's (2024, JRSS B) hedged-capital interval of the mean of values in [0, 1], the
    fixed-size one: every m at which neither bet, on the values above m or below it, has multiplied its capital
    to 1 / (1 − level) (each holding half), the bets' sizes from the values before (predictable plug-in), in an
    order drawn at random. Valid at any size for any distribution in [0, 1]; no bootstrap."""
    x = rng.permutation(np.asarray(x, dtype=float))
    n, alpha = len(x), 1 - level
    t = np.arange(1, n + 1)
    mu = (0.5 + np.cumsum(x)) / (t + 1)
    var = (0.25 + np.cumsum((x - mu) ** 2)) / (t + 1)
    lam = np.sqrt(2 * np.log(2 / alpha) / (n * np.concatenate([[0.25], var[:-1]])))
    m = np.linspace(0, 1, 2001)[1:-1, None]
    up = np.prod(1 + np.minimum(lam, c / m) * (x - m), axis=1)
    down = np.prod(1 - np.minimum(lam, c / (1 - m)) * (x - m), axis=1)
    kept = m[np.maximum(up, down) / 2 < 1 / alpha, 0]
    return (float(kept.min()), float(kept.max())) if len(kept) else (np.nan, np.nan)


def interval_row(G: int, k: int, beta: tuple[float, float], sim: int, names: list[str], logit=None) -> dict:
    """The report's value and interval of each metric on simulated cell `sim`; and exact_match's betting interval
    of its prompts' shares (`betting`), and Korn and Graubard's with their degrees-of-freedom shrinkage (`kg-df`;
    the report's is without it)."""
    cell, groups = draw(G, k, beta, np.random.default_rng([G, k, sim, 71]), logit)
    settings = Settings(tuple(names), with_ci=True, n_boot=1000, n_boot_corpus=200, seed=sim, sample_size=None)
    row = {"model": "sim", "strategy": "s"}
    _, kept = score(
        [(m, METRICS.get(m)) for m in names], settings, row, cell, groups, "s", prompts=[f"p{g}" for g in range(G)]
    )
    sums = kept.kept["exact_match"][1]
    row["betting"] = row["exact_match"]
    row["betting_ci_low"], row["betting_ci_high"] = betting(sums[:, 0] / sums[:, 1], np.random.default_rng(sim))
    row["kg-df"] = row["exact_match"]
    row["kg-df_ci_low"], row["kg-df_ci_high"] = korn_graubard(sums, 0.95, df=True) or (np.nan, np.nan)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0, help="the first simulation (a second run: --start 1000)")
    ap.add_argument("--prompts", type=int, nargs="*", default=[16, 32, 64])
    ap.add_argument("--samples", type=int, default=8, help="answers a prompt")
    ap.add_argument("--beta", type=float, nargs=2, metavar=("A", "B"), default=[0.5, 0.5])
    ap.add_argument("--population", type=int, default=50_000, help="prompts of the population cell")
    ap.add_argument("--logit-normal", type=float, nargs=2, metavar=("MU", "SIGMA"), default=None,
                    help="the second process: p_i = expit(MU + SIGMA * N(0, 1)) in place of --beta")  # fmt: skip
    args = ap.parse_args()
    k, beta, logit = args.samples, tuple(args.beta), args.logit_normal
    names = names_for(k)
    population, _ = draw(args.population, k, beta, np.random.default_rng([k, 7]), logit)
    truth = evaluate([(m, METRICS.get(m)) for m in names], population)
    process = f"logit-normal{tuple(logit)}" if logit else f"Beta{beta}"
    print(f"{process}, {k} answers a prompt; the truth: " + ", ".join(f"{m} {v:.4f}" for m, v in truth.items()))
    for G in args.prompts:
        t0 = time.perf_counter()
        rows = [interval_row(G, k, beta, sim, names, logit) for sim in range(args.start, args.start + args.sims)]
        for m in [*names, "betting", "kg-df"]:
            value = np.array([r[m] for r in rows])
            low = np.array([r.get(f"{m}_ci_low", np.nan) for r in rows])
            high = np.array([r.get(f"{m}_ci_high", np.nan) for r in rows])
            target = truth["exact_match" if m in ("betting", "kg-df") else m]
            above, below = int(np.sum(target > high)), int(np.sum(target < low))
            n = len(rows)
            normal = 2 * 1.959964 * value.std(ddof=1)
            print(
                f"  {m:12s} G={G:4d}  covers {100 * (n - above - below) / n:5.1f}% (truth above {above}, below "
                f"{below})  mean width x{np.nanmean(high - low) / normal:.2f} of the normal one",
                flush=True,
            )
        print(f"  ({args.sims} simulations, {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
