"""Per-job overhead of the distributed path (RQ queue + Redis bookkeeping + heartbeats)
against local mode, on the same jobs, in one process, side by side.

    python benchmarks/bench_distributed_overhead.py                       # bundled austen-tiny, file store
    python benchmarks/bench_distributed_overhead.py --s3                  # also both sides on S3 (moto on loopback)
    python benchmarks/bench_distributed_overhead.py --model DIR --jobs 40

Both sides call the same `worker.engine.job.run_job` with the same warm model cache (the model is
loaded once before timing), so the difference is the distributed machinery alone: the
local side loops over the jobs as `decodebench run` does; the distributed side submits
them to a redis-server on loopback and drains them with one in-process
`decodebench_worker(...)` in burst mode. Rounds run in ABBA order on fresh sweeps (local, distributed,
distributed, local, …) so that a change of machine load affects both sides alike; medians
are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


BENCH_KEY = b"decodebench-benchmark-signing-key-0123456789"  # signs and checks the benchmark's jobs


def make_jobs(model: str, n: int, name: str, new_tokens: int = 4):
    from controller.sweep.load import parse_spec
    from controller.sweep.plan import plan

    spec = parse_spec(
        {
            "name": name,
            "models": [{"path": model, "name": "bench"}],
            "prompts": {"inline": [f"It is a truth universally acknowledged, {i}" for i in range(n)], "shard_size": 1},
            "strategies": [{"name": "greedy"}],
            "generation": {"max_new_tokens": new_tokens, "batch_size": 1, "warmup": False},
            "metrics": ["distinct_1"],
        }
    )
    return spec, plan(spec, "bench")


def run_local(jobs, store, runtime) -> float:
    from worker.engine.job import run_job

    start = time.perf_counter()
    for job in jobs:
        run_job(job, store=store, runtime=runtime)
    return time.perf_counter() - start


def run_distributed(conn, spec, store, runtime) -> tuple[float, float]:
    from controller.launch.submit import submit
    from worker.rq.reaper import Timing
    from worker.rq.worker import decodebench_worker
    from worker.sweepstate import read_status

    start = time.perf_counter()
    out = submit(conn, store, spec, "bench", key=BENCH_KEY)
    t_submit = time.perf_counter() - start
    timing = Timing(heartbeat_ttl=60, reaper_interval=15)
    worker = decodebench_worker(["bench"], connection=conn, store=store, runtime=runtime, timing=timing, key=BENCH_KEY)
    start = time.perf_counter()
    worker.work(burst=True)
    t_run = time.perf_counter() - start
    status = read_status(conn, "bench", out.sweep_id)
    assert status.total("done") == len(out.enqueued), status.cells
    return t_submit, t_run


def compare(conn, kind: str, make_store, args, runtime) -> None:
    """Rounds of local and distributed runs in ABBA order on one kind of store; print the medians."""
    local_t, dist_t, submit_t = [], [], []
    for r in range(args.rounds):
        order = ("local", "dist") if r % 2 == 0 else ("dist", "local")  # ABBA: cancels load drift
        for side in order:
            spec, jobs = make_jobs(args.model, args.jobs, f"{kind}-{side}-{r}", args.new_tokens)
            if side == "local":
                local_t.append(run_local(jobs, make_store(f"local-{r}"), runtime))
            else:
                t_submit, t_run = run_distributed(conn, spec, make_store(f"dist-{r}"), runtime)
                submit_t.append(t_submit)
                dist_t.append(t_run)
    n = args.jobs
    lo, di, su = (statistics.median(x) / n * 1000 for x in (local_t, dist_t, submit_t))
    print(f"[{kind} store] local mode      : {lo:7.1f} ms/job")
    print(f"[{kind} store] distributed     : {di:7.1f} ms/job (+ submit {su:.1f} ms/job)")
    print(
        f"[{kind} store] overhead        : {di - lo:+7.1f} ms/job, distributed/local = {di / lo:.2f}x "
        f"(with submit {(di + su) / lo:.2f}x)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "examples" / "models" / "austen-tiny"))
    p.add_argument("--jobs", type=int, default=30, help="jobs per side and round (one prompt each)")
    p.add_argument(
        "--rounds", type=int, default=4, help="rounds, in ABBA order (local, distributed, distributed, local, ...)"
    )
    p.add_argument("--new-tokens", type=int, default=4, help="tokens generated per job (short jobs show the overhead)")
    p.add_argument("--s3", action="store_true", help="also run both sides against S3 (moto's server on loopback)")
    args = p.parse_args()

    import logging
    import os

    import redis
    import structlog
    import torch

    from tests.support.services import redis_server, s3_env, s3_server
    from worker.engine.job import Runtime, run_job
    from worker.store import FileStore, open_store

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    logging.getLogger("rq").setLevel(logging.WARNING)
    for name in ("rq.worker", "rq.job", "rq.queue", "rq.scheduler"):
        logging.getLogger(name).setLevel(logging.WARNING)
    runtime = Runtime("cpu")
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    _, warm = make_jobs(args.model, 1, "warm-up")
    run_job(warm[0], store=FileStore(tmp / "warm"), runtime=runtime)  # load the model once

    print(
        f"distributed overhead benchmark: {args.jobs} jobs x {args.rounds} rounds, model {Path(args.model).name}, "
        f"{args.new_tokens} new tokens per job; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    stores = {"file": lambda tag: FileStore(tmp / tag)}
    contexts = []
    if args.s3:
        import boto3

        ctx = s3_server()
        endpoint = ctx.__enter__()
        contexts.append(ctx)
        os.environ.update(s3_env(endpoint))
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        stores["s3"] = lambda tag: open_store(f"s3://bench/{tag}")
    with redis_server() as (url, _):
        conn = redis.Redis.from_url(url)
        for kind, make_store in stores.items():
            compare(conn, kind, make_store, args, runtime)
    for ctx in contexts:
        ctx.__exit__(None, None, None)


if __name__ == "__main__":
    main()
