"""Report time and peak memory on a synthetic store: one process vs a process pool, cold and cached.

    python benchmarks/bench_report.py                          # 100 cells x 200 generations, pool of 2
    python benchmarks/bench_report.py --cells 2000 --gens 200 --workers 8

The store holds `--cells` cells of `--gens` generations each (top-p variants of one model, 2
seeds x gens/2 prompts, 8 prompts a job, synthetic texts from tests/helpers_report.py; every
result.json carries its generations' SHA-256, as a worker writes it). Each measurement runs
`controller.report.write.build` (what `decodebench report` runs) in a fresh subprocess and
prints its wall time and peak RSS (the controller, and the largest pool process):

- `memory`: the old path, every generation loaded into the controller, one process;
- `single`: streamed, one process, cold cache;
- `pooled`: streamed, `--workers` processes, cold cache;
- `cached`: the same report again, every cell from report/cache/.

It prints the pooled/single speed-up; the ratio is bounded by the cores the machine has.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_store(path: Path, n_cells: int, gens: int) -> str:
    from tests.helpers_report import make_sweep
    from worker.core import paths
    from worker.store import FileStore
    from worker.store.base import jsonl_bytes

    cells = [("m", "top_p", {"p": round(0.5 + i / (2 * n_cells), 6)}) for i in range(n_cells)]
    data = make_sweep(seeds=(0, 1), n_prompts=max(2, gens // 2), cells=cells, shard_size=8, batch_size=4)
    store = FileStore(path)
    store.write_json(paths.spec_key(data.tenant, data.sweep_id), data.spec)
    by_job: dict[str, list] = {}
    for g in data.generations:
        by_job.setdefault(g.job_id, []).append(g.model_dump())
    for r in data.results:
        body = jsonl_bytes(by_job.get(r.job.job_id, []))
        store.write_bytes(paths.generations_key(data.tenant, data.sweep_id, r.job.job_id), body)
        result = r.model_copy(update={"generations_sha256": hashlib.sha256(body).hexdigest()})
        store.write_json(paths.result_key(data.tenant, data.sweep_id, r.job.job_id), result.model_dump(mode="json"))
    return data.sweep_id


def measure(args: argparse.Namespace) -> None:
    """One report in this process; prints a JSON line."""
    from controller.report.aggregate import load_sweep, summarize
    from controller.report.write import build
    from worker.store import FileStore

    store = FileStore(args.store)
    t0 = time.perf_counter()
    if args.mode == "memory":
        data = load_sweep(store, "default", args.sweep)
        summary = summarize(data, n_boot=args.n_boot)
    else:
        _, summary = build(store, "default", args.sweep, n_boot=args.n_boot, workers=args.workers)
    wall = time.perf_counter() - t0
    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "rss_mb": self_mb, "child_rss_mb": child_mb, "rows": len(summary)}))


def run(mode: str, store: str, sweep: str, workers: int, n_boot: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", mode, "--store", store, "--sweep", sweep,
           "--workers", str(workers), "--n-boot", str(n_boot)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=100)
    ap.add_argument("--gens", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--measure", dest="mode", default=None)
    ap.add_argument("--store", default=None)
    ap.add_argument("--sweep", default=None)
    args = ap.parse_args()
    if args.mode:
        return measure(args)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sweep = make_store(Path(tmp), args.cells, args.gens)
        print(f"store: {args.cells} cells x {args.gens} generations ({time.perf_counter() - t0:.0f} s to write); "
              f"{os.cpu_count()} CPUs; n_boot {args.n_boot}")  # fmt: skip
        cache = Path(tmp) / "default" / "sweeps" / sweep / "report" / "cache"
        found = {}
        for mode, workers in (("memory", 1), ("single", 1), ("pooled", args.workers), ("cached", args.workers)):
            if mode != "cached" and cache.exists():
                for f in cache.iterdir():
                    f.unlink()
            found[mode] = r = run(mode, tmp, sweep, workers, args.n_boot)
            print(f"  {mode:7s} workers {workers}: {r['wall_s']:7.1f} s, controller peak RSS {r['rss_mb']:6.0f} MB, "
                  f"largest pool process {r['child_rss_mb']:6.0f} MB")  # fmt: skip
        print(
            f"pooled / single speed-up: {found['single']['wall_s'] / found['pooled']['wall_s']:.2f}x "
            f"on {args.workers} workers; cached / single: {found['single']['wall_s'] / found['cached']['wall_s']:.1f}x"
        )


if __name__ == "__main__":
    main()
