"""Calibration of the report's paired comparisons: the size of its tests and the coverage of its paired intervals.

    python benchmarks/bench_paired.py          # 500 simulated pairs at 16, 32, 128 prompts; effects 0 and 0.1
    python benchmarks/bench_paired.py --sims 200 --prompts 32 --effect 0
    python benchmarks/bench_paired.py --process markov --seeds 1   # the null on the second process, 1 seed
    python benchmarks/bench_paired.py --seeds 1 --effect 0          # the null on this process, 1 seed
    python benchmarks/bench_paired.py --effect 0 --unequal 3 1 --prompts 32   # 3 generations a prompt against 1
    python benchmarks/bench_paired.py --effect 0.1 --unequal 8 1 --prompts 32 # its power, 8 against 1

Each simulation draws two cells A and B of one sweep as decodebench makes them: the same G prompts
× 3 seeds (`--seeds`), and **common random numbers**: a generation's draws come from a stream seeded by (prompt,
seed), which both cells share, so their texts for a prompt and seed are correlated (here: each
position of a generation takes the shared stream's uniforms with probability 0.5 and the cell's own
otherwise, which leaves each cell's distribution what it would be alone). The prompts are
bench_coverage's skewed ones (a repetition propensity from Beta(0.3, 2), a lognormal length, a
topic of its own, a skewed mean token NLL).

- `--effect 0` (the null): B draws from the same process as A, so every metric's expected
  difference is 0 and the pair (A, B) of a prompt is exchangeable: a valid test rejects "no
  difference" at p < 0.05 in at most 5% of the simulations, and the paired interval covers 0 in 95%.
- `--effect E` (> 0): B repeats more (each prompt's repetition propensity × (1 + E), capped) and
  writes longer (× (1 + E / 2)); the truth is the difference of the population values (the metric
  on 20,000 prompts of each process) for the ratio metrics, and the mean difference over the
  simulations for distinct-n and self-BLEU (whose values depend on the corpus size). It prints
  each interval's coverage of that truth and each test's power.

BLEU is compared on pairs of their own (`pair_with_references`: bench_coverage's reference cells, a
reference per prompt that each generation copies word by word with a skewed propensity, with common
random numbers as above; under an effect B copies more, its propensity × (1 + E)).

The comparisons are the report's own (`controller.report.stats.paired.compare_pair`, fed what
`confidence_intervals(keep=)` keeps: per-prompt sums of the additive metrics, leave-one-out values
of the plain ones), i.e. the paired bootstrap-t and the permutation test for rep_2, mean length and
perplexity and BLEU, the bootstrap-t of the difference's jackknife pseudo-values for distinct-2 and self-BLEU-4,
with the permutation test of distinct-n recomputed on swapped prompts (since 2026-12-07) and the jackknife
t-test for self-BLEU. Also printed: how often the smallest Holm-adjusted p-value of the
metrics of a pair is below 0.05 (the family-wise error rate, under the null).

`--process markov` (issue 46): the null on benchmarks/process_markov.py instead, a second process unlike
this one in every mechanism the statistics see (a Markov chain, degenerate loops with an onset hazard,
length and EOS coupled, references copied in runs), `--seeds` generations per prompt (1 or 3) as here, A and B
independent draws on the same prompts; its metrics add eos_rate, a 0/1 share (McNemar's exact test with
one generation per prompt, the permutation test with several).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_coverage import SEEDS, VOCAB, ZIPF, prompt_params, reference
from benchmarks.process_markov import simulate_pair
from controller.metrics import METRICS, CellData
from controller.report.compute.cells import Settings, score
from controller.report.stats.cellstats import CellStats
from controller.report.stats.intervals import cell_rng, evaluate, prompt_groups
from controller.report.stats.paired import compare_pair, holm

METRIC_NAMES = ["rep_2", "mean_length", "perplexity", "distinct_2", "self_bleu_4", "bleu"]
PROCESS = ["skewed"]  # --process
REFERENCE_NAMES = ("bleu",)  # on `pair_with_references`, the others on `pair_of_cells`
RATIO_NAMES = ("rep_2", "mean_length", "perplexity", "bleu")  # truth: the population difference (else the mean)
CUM_ZIPF = np.cumsum(ZIPF)
SHARED = 0.5  # the chance that a position of a generation takes the shared stream's uniforms
PAIR_SEEDS = [SEEDS]  # --seeds: generations per prompt of either process's pairs
UNEQUAL: list[tuple[int, int] | None] = [None]  # --unequal K_A K_B: each cell's first K generations of a prompt
START = [0]  # --start: the first simulation
MAX_POSITIONS = 512  # uniforms drawn for every generation, whatever its length: an effect on B leaves A's draws alone


def generation(p: dict, u: np.ndarray) -> tuple[list[str], float, int]:
    """bench_coverage's generative process driven by given uniforms: u[0] the length, u[1 + 3t:4 + 3t]
    position t's branch, pick and NLL (one uniform a decision, so two cells can share them)."""
    n = min(max(1, int(sps.poisson.ppf(u[0], p["length"]))), (len(u) - 1) // 3)
    words: list[int] = []
    for t in range(n):
        branch, pick = u[1 + 3 * t], u[2 + 3 * t]
        if len(words) > 2 and branch < p["rep"]:  # continue an earlier occurrence: repeated n-grams
            starts = [i + 1 for i, w in enumerate(words[:-1]) if w == words[-1]]
            words.append(words[starts[int(pick * len(starts))]] if starts else words[int(pick * len(words))])
        elif branch < p["rep"] + (1 - p["rep"]) * 0.3:
            words.append(int(p["topic"][int(pick * 30)]))
        else:
            words.append(min(int(np.searchsorted(CUM_ZIPF, pick)), VOCAB - 1))
    z = sps.norm.ppf(np.clip(u[3 : 3 + 3 * n : 3], 1e-12, 1 - 1e-12))
    return [f"w{w}" for w in words], float(n * p["nll"] + z.sum()), n


def uniforms(shared: np.random.Generator, own: np.random.Generator, positions: int) -> np.ndarray:
    """One generation's uniforms (the length's, then 3 a position): a decision takes the shared stream's
    with probability SHARED (the coin is shared too), else the cell's own, so two cells' draws are
    correlated and each cell's are still independent uniforms."""
    size = 1 + 3 * positions
    common, mine, coin = shared.random(size), own.random(size), shared.random(positions + 1)
    return np.where(np.concatenate([coin[:1], np.repeat(coin[1:], 3)]) < SHARED, common, mine)


def pair_of_cells(G: int, sim: int, effect: float) -> tuple[CellData, CellData, list[list[int]]]:
    """Cells A and B on the same G prompts, common random numbers seeded by (simulation, prompt, seed)."""
    rng = np.random.default_rng([G, sim])
    cells: dict[str, dict[str, list]] = {c: {"words": [], "nll_sum": [], "nll_count": []} for c in "AB"}
    keys = []
    for g in range(G):
        p = prompt_params(rng)
        q = p | {"rep": min(0.95, p["rep"] * (1 + effect)), "length": p["length"] * (1 + effect / 2)}
        for s in range(PAIR_SEEDS[0]):
            for name, params, own in (("A", p, 1), ("B", q, 2)):
                u = uniforms(
                    np.random.default_rng([G, sim, g, s]), np.random.default_rng([G, sim, g, s, own]), MAX_POSITIONS
                )
                w, nll, n = generation(params, u)
                cells[name]["words"].append(w), cells[name]["nll_sum"].append(nll), cells[name]["nll_count"].append(n)
            keys.append(f"p{g}")
    out = [CellData(texts=[" ".join(w) for w in c["words"]], **c) for c in cells.values()]
    return out[0], out[1], prompt_groups(keys)


def pair_with_references(G: int, sim: int, effect: float) -> tuple[CellData, CellData, list[list[int]]]:
    """Cells A and B with references (bench_coverage's `reference_cell`: a reference per prompt, each
    generation copying its words with the prompt's propensity, else dropping one or writing another),
    common random numbers as in `pair_of_cells`; B copies more: its propensity × (1 + E), capped."""
    rng = np.random.default_rng([G, sim, 5])
    texts: dict[str, list[str]] = {"A": [], "B": []}
    refs, keys = [], []
    for g in range(G):
        ref = reference(rng)
        copy = rng.beta(1.5, 3.0)
        for s in range(PAIR_SEEDS[0]):
            for name, c, own in (("A", copy, 1), ("B", min(0.95, copy * (1 + effect)), 2)):
                u = uniforms(np.random.default_rng([G, sim, g, s, 5]), np.random.default_rng([G, sim, g, s, 5, own]),
                             len(ref))  # fmt: skip
                out = []
                for t, w in enumerate(ref):  # a position: copy, drop (10% of the rest) or another word
                    branch, pick = u[1 + 3 * t], u[2 + 3 * t]
                    if branch < c:
                        out.append(w)
                    elif branch < 1 - 0.1 * (1 - c):
                        out.append(min(int(np.searchsorted(CUM_ZIPF, pick)), VOCAB - 1))
                texts[name].append(" ".join(f"w{w}" for w in out))
            refs.append(" ".join(f"w{w}" for w in ref)), keys.append(f"p{g}")
    a, b = (CellData(texts=t, words=[x.split() for x in t], references=refs) for t in texts.values())
    return a, b, prompt_groups(keys)


def stats_of(name: str, cell: CellData, groups: list[list[int]], names: list[str]) -> CellStats:
    """What the report keeps of a cell for its comparisons: the report's own `cells.score` (the cell's own
    intervals, which it also computes, are not used: 2 replicates keep them cheap)."""
    selected = [(m, METRICS.get(m)) for m in names]
    settings = Settings(tuple(names), with_ci=True, n_boot=2, n_boot_corpus=2, seed=0, sample_size=None)
    prompts = [f"p{g}" for g in range(len(groups))]
    _, stats = score(selected, settings, {"model": "sim", "strategy": name}, cell, groups, name, prompts=prompts)
    return stats


def by_pair() -> list[tuple[Callable, list[str], str]]:
    """Each simulated pair's maker, the selected metrics compared on it, and its random stream's key."""
    if PROCESS[0] == "markov":
        return [(markov_pair, list(METRIC_NAMES), "M")]
    return [
        (pair_of_cells, [m for m in METRIC_NAMES if m not in REFERENCE_NAMES], "G"),
        (pair_with_references, [m for m in METRIC_NAMES if m in REFERENCE_NAMES], "R"),
    ]


def markov_pair(G: int, sim: int, effect: float) -> tuple[CellData, CellData, list[list[int]]]:
    """The null on benchmarks/process_markov.py (issue 46's second process): A and B independent draws on the
    same G prompts × PAIR_SEEDS[0] generations, so a prompt's pair is exchangeable."""
    assert effect == 0, "--process markov simulates the null only"
    a, b, keys = simulate_pair(G, np.random.default_rng([G, sim, 46]), PAIR_SEEDS[0])
    return a, b, prompt_groups(keys)


MARKOV_NAMES = ["rep_2", "mean_length", "eos_rate", "distinct_2", "self_bleu_4", "bleu"]


def population_diff(effect: float, n_prompts: int) -> dict[str, float]:
    """The ratio metrics' population difference B − A (both on the same n_prompts prompts)."""
    out = {}
    for make, names, _ in by_pair():
        selected = [(m, METRICS.get(m)) for m in names if m in RATIO_NAMES]
        if selected:
            a, b, _ = make(n_prompts, 10**6, effect)
            va, vb = evaluate(selected, a), evaluate(selected, b)
            out |= {m: vb[m] - va[m] for m, _ in selected}
    return out


def first(cell: CellData, groups: list[list[int]], k: int) -> tuple[CellData, list[list[int]]]:
    """The cell with each prompt's first k generations (`--unequal`)."""
    kept = [grp[:k] for grp in groups]
    return cell.subset([i for grp in kept for i in grp]), prompt_groups(
        [f"p{g}" for g, grp in enumerate(kept) for _ in grp]
    )


def run(G: int, sims: int, effect: float, n_boot: int) -> list[dict[str, tuple[float, float, float, float]]]:
    rows, pairs = [], [(make, names, key) for make, names, key in by_pair() if names]
    for sim in range(START[0], START[0] + sims):
        row = {}
        for make, names, key in pairs:
            a, b, groups = make(G, sim, effect)
            groups_a = groups_b = groups
            if UNEQUAL[0]:  # A keeps each prompt's first k_a generations, B its first k_b
                (a, groups_a), (b, groups_b) = first(a, groups, UNEQUAL[0][0]), first(b, groups, UNEQUAL[0][1])
            metrics = {m: METRICS.get(m) for m in names}
            pair = compare_pair(stats_of("B", b, groups_b, names), stats_of("A", a, groups_a, names), metrics,
                                n_boot=n_boot, rng=cell_rng(sim, f"{key}{G}"))  # fmt: skip
            row |= {m: tuple(pair[f"{m}{s}"] for s in ("_diff", "_diff_ci_low", "_diff_ci_high", "_diff_p"))
                    for m in names}  # fmt: skip
        rows.append(row)
    return rows


def report(G: int, rows: list[dict], effect: float, truth: dict[str, float]) -> None:
    n = len(rows)
    for m in METRIC_NAMES:
        arr = np.array([r[m] for r in rows], dtype=float)
        target = 0.0 if effect == 0 else truth.get(m, float(np.mean(arr[:, 0])))
        above, below = int(np.sum(target > arr[:, 2])), int(np.sum(target < arr[:, 1]))
        cover = 1 - (above + below) / n
        rejected = float(np.mean(arr[:, 3] < 0.05))
        what = "size (rejected at 0.05)" if effect == 0 else "power (rejected at 0.05)"
        mc = [math.sqrt(x * (1 - x) / n) for x in (cover, rejected)]  # the simulations' own error
        print(f"  {m:12s} G={G:4d}  interval covers {cover:6.1%} (±{mc[0]:.1%}; truth above {above}, below {below})"
              f"  {what} {rejected:6.1%} (±{mc[1]:.1%})"
              f"  mean width {np.mean(arr[:, 2] - arr[:, 1]):.4g}"
              + (f"  truth {target:+.4g} = {target / np.std(arr[:, 0], ddof=1):+.2f} SD of the differences"
                 if effect else ""))  # fmt: skip
    if effect == 0:
        fwer = np.mean([min(holm([r[m][3] for m in METRIC_NAMES])) < 0.05 for r in rows])
        k = len(METRIC_NAMES)
        print(f"  {'any metric':12s} G={G:4d}  smallest Holm p of the {k} below 0.05: {fwer:.1%} (family-wise error)")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sims", type=int, default=500)
    ap.add_argument("--prompts", type=int, nargs="*", default=[16, 32, 128])
    ap.add_argument("--effect", type=float, nargs="*", default=[0.0, 0.1])
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--population", type=int, default=20_000, help="prompts of the population cells")
    ap.add_argument("--metrics", nargs="*", default=None,
                    help="these (default: the process's list above; any registered metric the cells can give, "
                    "e.g. distinct_3)")  # fmt: skip
    ap.add_argument("--process", choices=["skewed", "markov"], default="skewed",
                    help="the generative process: this script's (common random numbers), or "
                    "benchmarks/process_markov.py's (the null only, independent draws)")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=SEEDS, help="generations per prompt")
    ap.add_argument("--unequal", type=int, nargs=2, metavar=("K_A", "K_B"), default=None,
                    help="unequal generations a prompt: A keeps each prompt's first K_A, B its first K_B (of "
                    "max(K_A, K_B) simulated; e.g. 3 1, 8 1: sampling against greedy); under an effect, the "
                    "ratio metrics' truth is still the population difference (it does not depend on K)")  # fmt: skip
    ap.add_argument("--start", type=int, default=0, help="the first simulation (a second run: --start 1000)")
    args = ap.parse_args()
    PAIR_SEEDS[0] = args.seeds
    START[0] = args.start
    if args.unequal:
        if min(args.unequal) < 1:
            ap.error("--unequal: two counts of at least 1")
        UNEQUAL[0] = tuple(args.unequal)
        PAIR_SEEDS[0] = max(args.unequal)
    if args.process == "markov":
        PROCESS[0] = "markov"
        METRIC_NAMES[:] = MARKOV_NAMES
        if args.effect != [0.0]:
            args.effect = [0.0]
            print("--process markov: the null only (--effect 0)")
    if args.metrics:
        if unknown := [m for m in args.metrics if m not in METRICS]:
            ap.error(f"--metrics: no metric named {', '.join(unknown)}")
        METRIC_NAMES[:] = list(dict.fromkeys(args.metrics))
    t0 = time.perf_counter()
    for effect in args.effect:
        truth = population_diff(effect, args.population) if effect else {}
        print(f"effect {effect}: " + (", ".join(f"{k} {v:+.5g}" for k, v in truth.items()) or "the null"))
        for G in args.prompts:
            report(G, run(G, args.sims, effect, args.n_boot), effect, truth)
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
