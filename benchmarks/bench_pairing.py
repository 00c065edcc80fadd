"""What pairing buys: the width of a cell-vs-baseline interval with and without pairing, on a real sweep.

    python benchmarks/bench_pairing.py SWEEP --store runs/demo      # e.g. the quickstart (`make demo`)

Generation seeds hash only (job seed, prompt id), so two cells of a sweep drew the same random
numbers for the same prompt and seed (common random numbers). For every cell against its
model's first cell and every additive metric, the script bootstraps the difference of the two
cells' values over prompts (percentile, 2,000 draws, both cells' statistics from per-prompt sums):

- paired: one draw of prompt indices for both cells (what the report does);
- unpaired: an independent draw for each cell, as if they were separate samples.

It prints, per metric, the median over cells of the unpaired / paired interval width (> 1:
pairing narrows the interval) and of the widths themselves.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from controller.metrics import METRICS, cell_data
from controller.report.load.sweep import load_sweep
from controller.report.stats.bootstrap_t import prompt_sums, values_of
from worker.store import open_store

B = 2000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep")
    ap.add_argument("--store", default="./runs")
    ap.add_argument("--tenant", default="default")
    ap.add_argument("--baseline", default=None, help="a strategy name (default: each model's first cell)")
    args = ap.parse_args()
    store = open_store(args.store)
    data = load_sweep(store, args.tenant, store.resolve_sweep(args.tenant, args.sweep))
    by_cell = defaultdict(list)
    for g in data.generations:
        by_cell[g.cell].append(g)
    order = list(dict.fromkeys(r.job.cell for r in sorted(data.results, key=lambda r: data.cell_order.index(r.job.cell)
                                                           if r.job.cell in data.cell_order else 0)))  # fmt: skip
    first = {}
    for cell in order:
        if args.baseline is None or by_cell[cell][0].strategy == args.baseline:
            first.setdefault(by_cell[cell][0].model, cell)
    rng = np.random.default_rng(0)
    ratios, widths = defaultdict(list), defaultdict(list)
    for cell in order:
        base = first[by_cell[cell][0].model]
        if cell == base:
            continue
        prompts = sorted({g.prompt_id for g in by_cell[cell]} & {g.prompt_id for g in by_cell[base]})
        sums = {}
        for key in (cell, base):
            recs = sorted((g for g in by_cell[key] if g.prompt_id in prompts), key=lambda g: (g.prompt_id, g.job_seed))
            groups = [[i for i, g in enumerate(recs) if g.prompt_id == p] for p in prompts]
            sums[key] = (cell_data(recs), groups)
        for name, metric in sorted(METRICS.items()):
            if not metric.additive or metric.needs_references and not any(g.reference for g in by_cell[cell]):
                continue
            per = []
            for key in (cell, base):
                cd, groups = sums[key]
                st = metric.stats(cd)
                per.append(None if st is None else prompt_sums(st, groups))
            if per[0] is None or per[1] is None:
                continue
            f = values_of(metric.combine)
            G = len(prompts)
            ia, ib = rng.integers(0, G, (B, G)), rng.integers(0, G, (B, G))
            paired = f(per[0][ia].sum(1)) - f(per[1][ia].sum(1))
            unpaired = f(per[0][ia].sum(1)) - f(per[1][ib].sum(1))
            wp = np.subtract(*np.nanpercentile(paired, [97.5, 2.5]))
            wu = np.subtract(*np.nanpercentile(unpaired, [97.5, 2.5]))
            if wp > 0 and np.isfinite(wu):
                ratios[name].append(wu / wp)
                widths[name].append((wp, wu))
    against = f"its model's {args.baseline} cell" if args.baseline else "its model's first cell"
    print(f"sweep {data.sweep_id}: {len(order)} cells, each against {against}")
    for name in sorted(ratios):
        wp, wu = np.median(np.array(widths[name]), axis=0)
        print(f"  {name:16s} unpaired/paired width: median {np.median(ratios[name]):5.2f} "
              f"(range {min(ratios[name]):.2f}-{max(ratios[name]):.2f}); median widths paired {wp:.4g}, "
              f"unpaired {wu:.4g}")  # fmt: skip


if __name__ == "__main__":
    main()
