"""Coverage of the report's 95% intervals on skewed synthetic populations.

    python benchmarks/bench_coverage.py                     # 500 simulations at 16, 32 and 128 prompts
    python benchmarks/bench_coverage.py --sims 100 --prompts 32

Each simulation draws a cell as a sweep would make it: G prompts × 3 seeds, every prompt with
its own skewed parameters (a repetition propensity from Beta(0.3, 2): most prompts hardly
repeat, a few loop; a lognormal length; a 30-word topic of its own; a skewed mean token NLL),
three generations per prompt drawn independently given those; for BLEU and eos_rate a cell of
its own (`reference_cell`: references, a skewed copy propensity, a rare EOS). The report's own
interval code (`controller.report.stats.intervals.confidence_intervals`, i.e. the studentised bootstrap
over prompts, Student's t(G-1) as the floor, for rep_2, mean length, perplexity, BLEU and eos_rate;
the exact delete-one-prompt jackknife, bootstrap-t of its pseudo-values on the logit scale with the
same floor, for distinct-2 and self-BLEU-4) gives each metric's interval, and the script counts how
often it covers the truth:

- for the ratio metrics (rep_2, mean_length, perplexity, BLEU, eos_rate) the population value,
  the metric on 20,000 prompts;
- for distinct-n and self-BLEU, whose value depends on the corpus size (distinct-n falls as a
  cell grows), the expected value at this size, the mean over the simulations.

Ratings: G items, 3 raters, item quality 1 + 4 · Beta(0.6, 2.5) (skewed), scores rounded and
clipped to 1-5 around it; the interval is the report's bootstrap-t over items of the mean score.

It prints, per metric and size, the coverage, the misses above and below the interval, and the mean
width against a normal interval's with the true spread (2 · 1.96 · the SD of the estimates over the
simulations: what an interval that knew the spread would need).

`--seeds N` draws N generations per prompt (default 3; 1 is a greedy-style or one-seed sweep), and
`--process markov` draws the cells from a second, different generative process instead
(benchmarks/process_markov.py: a Markov chain over the vocabulary, loops with a per-prompt onset
hazard, length and EOS coupled by a per-prompt stop hazard, references copied in runs), so that no
interval is tuned to one simulation (issue 46); its metrics are rep_2, mean_length, distinct_2, BLEU
and eos_rate, all on one cell.

`--variants` also prints, for the jackknife metrics, what other intervals built from the same
leave-one-out values would cover (Student's t(G-1) around the estimate, on the logit scale as the
report's; BCa of the pseudo-values with the same t floor) and the jackknife SE against the standard
deviation of the estimates over the simulations (with a 95% range from resampling the simulations:
how firm that ratio is): why the report's interval is the one it is. `--halves K` adds the delete-half
jackknife's SE from K random halves of the prompts against the same spread.

To run more simulations on several cores, split them and report them together:

    python benchmarks/bench_coverage.py --prompts 128 --sims 2000 --save a.json &
    python benchmarks/bench_coverage.py --prompts 128 --sims 2000 --start 2000 --save b.json
    python benchmarks/bench_coverage.py --load a.json b.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ beside it

from benchmarks import process_markov
from controller.metrics import METRICS, CellData
from controller.report.ratings.scores import _bootstrap as rating_interval
from controller.report.stats.intervals import cell_rng, confidence_intervals, evaluate, prompt_groups

METRIC_NAMES = ["rep_2", "mean_length", "perplexity", "distinct_2", "self_bleu_4", "bleu", "eos_rate"]
REFERENCE_NAMES = ("bleu", "eos_rate")  # simulated on `reference_cell`, the others on `simulate_cell`
VOCAB = 3000
ZIPF = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
ZIPF /= ZIPF.sum()
SEEDS = 3  # generations per prompt (--seeds)
PROCESS = "skewed"  # --process


def prompt_params(rng: np.random.Generator) -> dict:
    return {
        "rep": rng.beta(0.3, 2.0),
        "length": float(np.clip(rng.lognormal(3.3, 0.5), 5, 120)),
        "topic": rng.integers(0, VOCAB, 30),
        "nll": 2.0 + rng.gamma(2.0, 0.5),
    }


def generation(p: dict, rng: np.random.Generator) -> tuple[list[str], float, int]:
    n = max(1, int(rng.poisson(p["length"])))
    words: list[int] = []
    for _ in range(n):
        if len(words) > 2 and rng.random() < p["rep"]:  # continue an earlier occurrence: repeated n-grams
            starts = [i + 1 for i, w in enumerate(words[:-1]) if w == words[-1]]
            words.append(words[starts[rng.integers(len(starts))]] if starts else words[rng.integers(len(words))])
        elif rng.random() < 0.3:
            words.append(int(p["topic"][rng.integers(30)]))
        else:
            words.append(int(rng.choice(VOCAB, p=ZIPF)))
    nll = float(np.sum(rng.normal(p["nll"], 1.0, n)))
    return [f"w{w}" for w in words], nll, n


def simulate_cell(G: int, rng: np.random.Generator) -> tuple[CellData, list[list[int]]]:
    words, nll_sum, nll_count, keys = [], [], [], []
    for g in range(G):
        p = prompt_params(rng)
        for _ in range(SEEDS):
            w, s, c = generation(p, rng)
            words.append(w), nll_sum.append(s), nll_count.append(c), keys.append(f"p{g}")
    cell = CellData(texts=[" ".join(w) for w in words], words=words, nll_sum=nll_sum, nll_count=nll_count)
    return cell, prompt_groups(keys)


def reference(rng: np.random.Generator) -> list[int]:
    """A prompt's reference: a lognormal number of words, 30% from a topic of its own, the others Zipf."""
    length, topic = int(np.clip(rng.lognormal(3.0, 0.4), 5, 80)), rng.integers(0, VOCAB, 30)
    pick = lambda: int(topic[rng.integers(30)]) if rng.random() < 0.3 else int(rng.choice(VOCAB, p=ZIPF))
    return [pick() for _ in range(length)]


def reference_cell(G: int, rng: np.random.Generator) -> CellData:
    """A cell with a reference per prompt and stop reasons, for BLEU and eos_rate (its own random stream, so
    the other metrics' draws stay as they were). Per prompt: a reference of lognormal length (topic and Zipf
    words); a copy propensity from Beta(1.5, 3) (a few prompts followed closely, most loosely): each generation
    walks the reference and copies its word with that probability, else drops it (10%) or writes another
    word; an EOS propensity from Beta(0.2, 8) (mean 2.4%, most prompts almost never stop, a few often), each
    generation ending at EOS with it. BLEU's 4-gram matches come from the runs of copied words."""
    texts, refs, reasons = [], [], []
    for _ in range(G):
        ref = reference(rng)
        copy, eos = rng.beta(1.5, 3.0), rng.beta(0.2, 8.0)
        for _ in range(SEEDS):
            out = []
            for w in ref:
                u = rng.random()
                if u < copy:
                    out.append(w)
                elif u > 1 - 0.1 * (1 - copy):
                    continue
                else:
                    out.append(int(rng.choice(VOCAB, p=ZIPF)))
            texts.append(" ".join(f"w{w}" for w in out))
            refs.append(" ".join(f"w{w}" for w in ref))
            reasons.append("eos" if rng.random() < eos else "length")
    return CellData(texts=texts, words=[t.split() for t in texts], references=refs, stop_reasons=reasons)


MARKOV_NAMES = ["rep_2", "mean_length", "distinct_2", "bleu", "eos_rate"]  # one cell holds all their inputs


def markov_cell(G: int, rng: np.random.Generator) -> tuple[CellData, list[list[int]]]:
    cell, keys = process_markov.simulate_cell(G, rng, SEEDS)
    return cell, prompt_groups(keys)


def population(n_prompts: int, seed: int, process: str = "skewed") -> dict[str, float]:
    """The ratio metrics (and BLEU, eos_rate) on a very large cell: their population values."""
    if process == "markov":
        cell, _ = markov_cell(n_prompts, np.random.default_rng(seed))
        names = [m for m in MARKOV_NAMES if m != "distinct_2"]  # distinct-n: the expected value at the cell's size
        return evaluate([(m, METRICS.get(m)) for m in names], cell)
    cell, _ = simulate_cell(n_prompts, np.random.default_rng(seed))
    out = evaluate([(m, METRICS.get(m)) for m in ("rep_2", "mean_length", "perplexity")], cell)
    extra = [(m, METRICS.get(m)) for m in REFERENCE_NAMES if m in METRIC_NAMES]
    return {**out, **evaluate(extra, reference_cell(n_prompts, np.random.default_rng([seed, 5])))}


def rating_truth(rng: np.random.Generator, n: int = 200_000) -> float:
    return float(np.mean(rating_scores(rng, n)))


def rating_scores(rng: np.random.Generator, n_items: int, raters: int = 3) -> np.ndarray:
    quality = 1 + 4 * rng.beta(0.6, 2.5, n_items)
    return np.clip(np.rint(quality[:, None] + rng.normal(0, 0.7, (n_items, raters))), 1, 5)


def variants(value: float, loo: np.ndarray, rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """Other intervals from the same leave-one-out values (logit scale, mapped back), and the SE."""
    from scipy import stats

    from controller.report.stats.intervals import jackknife_se, pseudo_values

    logit, expit = (lambda x: np.log(x) - np.log1p(-x)), (lambda x: 1 / (1 + np.exp(-x)))
    G, centre = len(loo), float(logit(value))
    pv = pseudo_values(centre, logit(loo))
    se, q = jackknife_se(logit(loo)), float(stats.t.ppf(0.975, G - 1))
    bca = stats.bootstrap((pv,), np.mean, method="BCa", n_resamples=1000, rng=rng, vectorized=True)
    lo, hi = (float(x) + centre - float(pv.mean()) for x in bca.confidence_interval)
    return {
        "student_t": (expit(centre - q * se), expit(centre + q * se)),
        "bca_floor": (expit(min(lo, centre - q * se)), expit(max(hi, centre + q * se))),
        "se": (jackknife_se(loo), math.nan),
    }


def half_se(metric, cell: CellData, groups: list[list[int]], k: int, rng: np.random.Generator) -> float:
    """The delete-half jackknife's SE (Shao and Wu 1989: consistent for non-smooth statistics): the
    metric on `k` random halves of the prompts, sqrt((G - d) / d · mean squared deviation), d = G // 2."""
    G, d = len(groups), len(groups) // 2
    values = []
    for _ in range(k):
        idx = [i for g in rng.choice(G, G - d, replace=False) for i in groups[g]]
        part = CellData(texts=[cell.texts[i] for i in idx], words=[cell.words[i] for i in idx],
                        nll_sum=[cell.nll_sum[i] for i in idx], nll_count=[cell.nll_count[i] for i in idx])  # fmt: skip
        values.append(metric.fn(part))
    v = np.asarray(values, dtype=float)
    return math.sqrt((G - d) / d * float(np.mean((v - v.mean()) ** 2)))


def run(G: int, sims: int, n_boot: int, truth: dict[str, float], with_variants: bool = False,
        halves: int = 0, start: int = 0) -> dict[str, list]:  # fmt: skip
    markov = PROCESS == "markov"
    metrics = [(m, METRICS.get(m)) for m in METRIC_NAMES if markov or m not in REFERENCE_NAMES]
    on_references = [] if markov else [(m, METRICS.get(m)) for m in METRIC_NAMES if m in REFERENCE_NAMES]
    found: dict[str, list] = {m: [] for m in [*METRIC_NAMES, "rating"]}  # (value, low, high) per simulation
    for s in range(start, start + sims):
        rng = np.random.default_rng([G, s])
        cell, groups = markov_cell(G, rng) if markov else simulate_cell(G, rng)
        values = evaluate(metrics, cell)
        keep: dict = {}
        cis = confidence_intervals(
            metrics, cell, values, groups, n_boot=n_boot, n_boot_corpus=100, rng=cell_rng(s, f"G{G}"), keep=keep
        )
        if on_references:
            ref_cell = reference_cell(G, np.random.default_rng([G, s, 5]))
            ref_values = evaluate(on_references, ref_cell)
            values.update(ref_values)
            cis.update(confidence_intervals(on_references, ref_cell, ref_values, groups, n_boot=n_boot,
                                            n_boot_corpus=100, rng=cell_rng(s, f"R{G}")))  # fmt: skip
        for m in METRIC_NAMES:
            lo, hi, _ = cis.get(m, (math.nan, math.nan, ""))
            found[m].append((values[m], lo, hi))
            if with_variants and keep.get(m, ("",))[0] == "loo" and 0 < values[m] < 1:
                for how, (vlo, vhi) in variants(values[m], keep[m][1], np.random.default_rng([G, s, 2])).items():
                    found.setdefault(f"{m}:{how}", []).append((values[m], vlo, vhi))
                if halves:
                    se = half_se(METRICS.get(m), cell, groups, halves, np.random.default_rng([G, s, 3]))
                    found.setdefault(f"{m}:half_se", []).append((values[m], se, math.nan))
        scores = rating_scores(rng, G)
        lo, hi = rating_interval([list(map(int, r)) for r in scores], np.random.default_rng([G, s, 1]))
        found["rating"].append((float(scores.mean()), lo, hi))
    return found


def report(G: int, found: dict[str, list], truth: dict[str, float]) -> None:
    for m, rows in found.items():
        arr = np.array(rows, dtype=float)
        if m.endswith("se"):  # an SE (the jackknife's, the delete-half one) against the estimates' spread
            ratio = np.mean(arr[:, 1]) / np.std(arr[:, 0], ddof=1)
            idx = np.random.default_rng(0).integers(0, len(arr), (2000, len(arr)))  # the simulations resampled
            lo, hi = np.percentile(arr[idx, 1].mean(axis=1) / arr[idx, 0].std(axis=1, ddof=1), [2.5, 97.5])
            what = "delete-half SE" if m.endswith("half_se") else "jackknife SE"
            print(f"  {m:22s} G={G:4d}  {what} / SD of the estimates {ratio:.3f} (95% over the simulations "
                  f"{lo:.3f}-{hi:.3f})")  # fmt: skip
            continue
        target = truth[m] if m in truth else float(np.mean(arr[:, 0]))
        above = int(np.sum(target > arr[:, 2]))
        below = int(np.sum(target < arr[:, 1]))
        n = int(np.sum(np.isfinite(arr[:, 1])))
        cover = (n - above - below) / n if n else math.nan
        width = float(np.nanmean(arr[:, 2] - arr[:, 1]))
        mc = math.sqrt(cover * (1 - cover) / n) if n else math.nan  # the simulations' own error of the coverage
        normal = 2 * 1.959964 * np.std(arr[:, 0], ddof=1)  # a normal interval's width with the true spread
        print(f"  {m:22s} G={G:4d}  coverage {cover:6.1%} (±{mc:.1%})  misses: truth above {above:3d}, below {below:3d}"
              f"  (n={n}, mean width {width:.4g}, x{width / normal:.2f} a normal one's with the true SD)")  # fmt: skip
        sys.stdout.flush()


def combine(paths: list[str]) -> None:
    """One report of the simulations of several `--save` files (e.g. two halves run side by side); a
    simulation index that two files both hold is refused, as the same draws counted twice."""
    truth: dict[str, float] = {}
    runs: dict[int, dict[str, list]] = {}
    seen: dict[int, set[int]] = {}
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        truth = saved["truth"]
        for G, part in saved["runs"].items():
            G = int(G)
            n = len(next(iter(part["found"].values())))
            indices = set(range(part["start"], part["start"] + n))
            if indices & seen.setdefault(G, set()):
                sys.exit(f"{path}: simulations of G={G} overlap an earlier file's")
            seen[G] |= indices
            for m, rows in part["found"].items():
                runs.setdefault(G, {}).setdefault(m, []).extend(rows)
    for G in sorted(runs):
        print(f"G={G}: {len(seen[G])} simulations")
        report(G, runs[G], truth)


def main() -> None:
    global SEEDS, PROCESS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sims", type=int, default=500)
    ap.add_argument("--prompts", type=int, nargs="*", default=[16, 32, 128])
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--population", type=int, default=20_000, help="prompts of the population cell")
    ap.add_argument("--metrics", nargs="*", default=None, help="only these (and no ratings): any registered metric")
    ap.add_argument("--variants", action="store_true", help="other intervals of the jackknife metrics, and the SE")
    ap.add_argument("--halves", type=int, default=0, help="with --variants: the delete-half SE from this many halves")
    ap.add_argument("--start", type=int, default=0, help="index of the first simulation (to split a run)")
    ap.add_argument("--save", help="also write each simulation's (value, low, high) to this JSON file")
    ap.add_argument("--load", nargs="+", help="report the simulations of these --save files together; simulate none")
    ap.add_argument("--seeds", type=int, default=3, help="generations per prompt")
    ap.add_argument("--process", choices=["skewed", "markov"], default="skewed",
                    help="the generative process: this script's, or benchmarks/process_markov.py")  # fmt: skip
    args = ap.parse_args()
    if unknown := [m for m in args.metrics or () if m not in METRICS]:
        ap.error(f"--metrics: unknown metric {unknown[0]!r}")
    SEEDS, PROCESS = args.seeds, args.process
    t0 = time.perf_counter()
    if args.load:
        return combine(args.load)
    truth = population(args.population, seed=10**6, process=PROCESS)
    truth["rating"] = rating_truth(np.random.default_rng(10**6 + 1))
    print(f"{PROCESS} process, {SEEDS} generation(s) per prompt; population values ({args.population} prompts): "
          + ", ".join(f"{k} {v:.5g}" for k, v in truth.items()))  # fmt: skip
    if PROCESS == "markov":
        METRIC_NAMES[:] = MARKOV_NAMES
    if args.metrics:  # any registered metric the cells can give (zipf, distinct_1, ...), not only the defaults
        METRIC_NAMES[:] = list(dict.fromkeys(args.metrics))
    saved: dict = {"truth": truth, "runs": {}}
    for G in args.prompts:
        found = run(G, args.sims, args.n_boot, truth, args.variants, args.halves, args.start)
        if args.metrics:
            found.pop("rating")
        report(G, found, truth)
        saved["runs"][str(G)] = {"start": args.start, "found": found}
    if args.save:
        with open(args.save, "w") as f:
            json.dump(saved, f)
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
