"""Report time and peak memory on a synthetic store: one process vs a process pool vs report workers.

    python benchmarks/bench_report.py                          # 100 cells x 200 generations, 2 workers
    python benchmarks/bench_report.py --cells 2000 --gens 200 --workers 8
    python benchmarks/bench_report.py --cells 400 --n-boot 100 --modes single,cached   # memory vs cells

The store holds `--cells` cells of `--gens` generations each (top-p variants of one model, 2
seeds x gens/2 prompts, 8 prompts a job, synthetic texts from tests/support/report.py; every
result.json carries its generations' SHA-256, as a worker writes it). Each measurement runs
`controller.report.api.build` (what `decodebench report` runs) in a fresh subprocess and
prints its wall time and peak RSS (the controller, and the largest pool process):

- `memory`: the old path, every generation loaded into the controller, one process;
- `single`: streamed, one process, cold cache;
- `pooled`: streamed, `--workers` processes, cold cache;
- `distributed`: `report --distributed` as the operator runs it: a redis-server on loopback, `--workers`
  `decodebench report-worker` processes started (and warm) before the clock starts, one signed job
  per cell, then one per (cell, baseline) pair; the controller waits for them in the store and
  reduces (Holm, the reference row, the formats). The largest worker's peak RSS is read from /proc
  before it stops;
- `cached`: the same report again, every cell from report/cache/;
- `held` (after a mode that filled the cache): what the reduce holds of every cell's output, traced
  (tracemalloc of `cell_outputs`, every cell from the cache): the memory that grows with the
  cells on the controller besides planning, in MB and per cell.

Before the modes it prints what planning the report holds (`plan`, always): tracemalloc of
`load_sweep(with_generations=False)` + `cell_tasks` in a fresh subprocess, what the controller (and the
submission server planning report jobs) keeps for the whole report, in MB, per cell and per job.

`--profile DIR` writes each mode's controller profile (cProfile of the measured call) to
DIR/MODE.pstats (`python -m pstats DIR/distributed.pstats`): where the serial part goes.

It prints the pooled/single and distributed/single speed-ups; the ratios are bounded by the cores
the machine has (the workers and the controller share them here; in a cluster they do not). The
controller's own CPU seconds (user + system, its pool processes not counted) say what is left on
the controller once the map runs elsewhere, and are less disturbed than wall time by other work.
"""

from __future__ import annotations

import argparse
import contextlib
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
    from tests.support.report import make_sweep, write_with_hashes
    from worker.store import FileStore

    cells = [("m", "top_p", {"p": round(0.5 + i / (2 * n_cells), 6)}) for i in range(n_cells)]
    data = make_sweep(seeds=(0, 1), n_prompts=max(2, gens // 2), cells=cells, shard_size=8, batch_size=4)
    write_with_hashes(FileStore(path), data)
    return data.sweep_id


def measure_plan(args: argparse.Namespace) -> None:
    """What planning the report holds (traced Python memory of the loaded sweep and its cell tasks); a JSON line."""
    import tracemalloc

    from controller.metrics import METRICS
    from controller.report.compute.aggregate import cell_tasks
    from controller.report.load.sweep import load_sweep
    from worker.store import FileStore

    store = FileStore(args.store)
    tracemalloc.start()
    data = load_sweep(store, "default", args.sweep, with_generations=False)
    _, _, tasks = cell_tasks(data, args.n_boot, 0, 100, METRICS, store)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n_jobs = len(data.results)
    print(json.dumps({"held_mb": held / 2**20, "peak_mb": peak / 2**20, "jobs": n_jobs, "cells": len(tasks),
                      "per_job_kb": held / 1024 / n_jobs, "per_cell_kb": held / 1024 / len(tasks)}))  # fmt: skip


def measure_held(args: argparse.Namespace) -> None:
    """What the reduce holds of the cells' outputs, every one read from the cache (traced); a JSON line."""
    import tracemalloc

    from controller.metrics import METRICS
    from controller.report.compute.aggregate import cell_tasks
    from controller.report.compute.cache import ReportCache
    from controller.report.compute.celljob import cell_job, cell_outputs
    from controller.report.compute.runner import Runner
    from controller.report.load.sweep import load_sweep
    from worker.store import FileStore

    store = FileStore(args.store)
    data = load_sweep(store, "default", args.sweep, with_generations=False)
    selected, settings, tasks = cell_tasks(data, args.n_boot, 0, 100, METRICS, store)  # build()'s settings

    class Missing:  # the runner asks its remote backend for the cells not in the cache
        def compute(self, todo: list, cache, what: str):
            raise SystemExit(f"held: {len(todo)} cells are not in the cache: list `held` after a mode that fills it")

    tracemalloc.start()
    jobs = [cell_job(task, settings, None, cached=True) for task in tasks]
    outputs = cell_outputs(jobs, ReportCache(store, "default", data.sweep_id), Runner(remote=Missing()))
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(json.dumps({"held_mb": held / 2**20, "peak_mb": peak / 2**20, "cells": len(outputs),
                      "per_cell_kb": held / 1024 / len(outputs)}))  # fmt: skip


def measure(args: argparse.Namespace) -> None:
    """One report in this process; prints a JSON line."""
    if args.mode == "plan":
        return measure_plan(args)
    if args.mode == "held":
        return measure_held(args)
    from controller.report.api import build
    from controller.report.compute.aggregate import summarize
    from controller.report.load.sweep import load_sweep
    from worker.store import FileStore

    store = FileStore(args.store)
    profile = None
    if args.profile:  # where the controller's CPU goes: pstats files, one per mode (python -m pstats FILE)
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    t0 = time.perf_counter()
    if args.mode == "memory":
        data = load_sweep(store, "default", args.sweep)
        summary = summarize(data, n_boot=args.n_boot)
    elif args.mode == "distributed":
        from controller.cli.backend import Direct
        from controller.report.compute.runner import Runner
        from controller.report.distribute.remote import ReportWorkers

        def none_here(runner, tasks, todo, portable):  # every cell and pair by the report workers
            assert not todo, f"{len(todo)} {tasks[0].kind}s computed by the controller"
            return iter(())

        Runner._computed = none_here  # type: ignore[method-assign]
        workers = ReportWorkers(Direct(args.redis, args.store, "default"), stall_s=600, poll_s=0.2)
        _, summary = build(store, "default", args.sweep, n_boot=args.n_boot, remote=workers)
    else:
        _, summary = build(store, "default", args.sweep, n_boot=args.n_boot, workers=args.workers)
    wall = time.perf_counter() - t0
    if profile is not None:
        profile.disable()
        profile.dump_stats(str(Path(args.profile) / f"{args.mode}.pstats"))
    own = resource.getrusage(resource.RUSAGE_SELF)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so that of a process spawned by this bench
    # (which held the whole synthetic sweep while it wrote the store) was at least the bench's own peak
    self_mb, cpu = peak_rss_mb(os.getpid()), own.ru_utime + own.ru_stime  # the controller's own CPU, its pool's not
    child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "rss_mb": self_mb, "child_rss_mb": child_mb, "rows": len(summary)}))


def run(mode: str, store: str, sweep: str, workers: int, n_boot: int, redis: str = "", profile: str = "") -> dict:
    cmd = [sys.executable, __file__, "--measure", mode, "--store", store, "--sweep", sweep,
           "--workers", str(workers), "--n-boot", str(n_boot), "--redis", redis, "--profile", profile]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss_mb(pid: int) -> float:
    """A live process's peak RSS (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def report_workers(n: int, tmp: str, env: dict) -> dict:
    """A redis-server and `n` warm report-worker processes; yields the Redis URL and, at the end,
    the largest worker's peak RSS under "peak_mb"."""
    from tests.support.services import redis_server

    decodebench = str(Path(sys.executable).with_name("decodebench"))
    with redis_server() as (url, _):
        env = {**env, "DECODEBENCH_REDIS_URL": url, "DECODEBENCH_STORE": tmp, "DECODEBENCH_LOG_LEVEL": "warning"}
        procs = [subprocess.Popen([decodebench, "report-worker", "default"], env=env) for _ in range(n)]
        time.sleep(8)  # imported and waiting on the queue, as a deployed pool is
        out = {"url": url, "peak_mb": 0.0}
        try:
            yield out
        finally:
            out["peak_mb"] = max(peak_rss_mb(p.pid) for p in procs)
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=100)
    ap.add_argument("--gens", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--modes", default="memory,single,pooled,distributed,cached", help="which paths, in this order")
    ap.add_argument("--measure", dest="mode", default=None)
    ap.add_argument("--store", default=None)
    ap.add_argument("--sweep", default=None)
    ap.add_argument("--redis", default="")
    ap.add_argument("--profile", default="", help="a folder: each mode's controller profile as MODE.pstats")
    args = ap.parse_args()
    if args.mode:
        return measure(args)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sweep = make_store(Path(tmp), args.cells, args.gens)
        print(f"store: {args.cells} cells x {args.gens} generations ({time.perf_counter() - t0:.0f} s to write); "
              f"{os.cpu_count()} CPUs; n_boot {args.n_boot}")  # fmt: skip
        key = Path(tmp) / "signing.key"
        key.write_bytes(os.urandom(48).hex().encode())
        env = {**os.environ, "DECODEBENCH_SIGNING_KEY_FILE": str(key)}
        os.environ.update(env)
        cache = Path(tmp) / "default" / "sweeps" / sweep / "report" / "cache"
        p = run("plan", tmp, sweep, 1, args.n_boot)
        print(f"  plan: load_sweep + cell_tasks hold {p['held_mb']:6.1f} MB traced (peak {p['peak_mb']:.1f} MB): "
              f"{p['per_cell_kb']:.1f} KB a cell, {p['per_job_kb']:.2f} KB a job ({p['jobs']} jobs)")  # fmt: skip
        found = {}
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        for mode in modes:
            workers = 1 if mode in ("memory", "single") else args.workers
            if mode == "held":
                h = run(mode, tmp, sweep, 1, args.n_boot)
                print(f"  held: the reduce holds {h['held_mb']:6.1f} MB of the cells' outputs traced "
                      f"(peak {h['peak_mb']:.1f} MB): {h['per_cell_kb']:.1f} KB a cell")  # fmt: skip
                continue
            if mode != "cached" and cache.exists():
                for f in cache.iterdir():
                    f.unlink()
            if mode == "distributed":
                with report_workers(workers, tmp, env) as pool:
                    r = run(mode, tmp, sweep, workers, args.n_boot, pool["url"], args.profile)
                r["child_rss_mb"] = pool["peak_mb"]
            else:
                r = run(mode, tmp, sweep, workers, args.n_boot, profile=args.profile)
            found[mode] = r
            what = "largest report worker" if mode == "distributed" else "largest pool process"
            print(f"  {mode:11s} workers {workers}: {r['wall_s']:7.1f} s, controller CPU {r['cpu_s']:6.1f} s, "
                  f"controller peak RSS {r['rss_mb']:6.0f} MB, {what} {r['child_rss_mb']:6.0f} MB")  # fmt: skip
        if "single" in found:
            ratio = {m: f"{found['single']['wall_s'] / r['wall_s']:.2f}x" for m, r in found.items() if m != "single"}
            print(f"speed-up over single ({args.workers} workers): {ratio}")


if __name__ == "__main__":
    main()
