"""The report's reads from S3: one at a time vs the store's `read_concurrency` in flight, side by side.

    python benchmarks/bench_store_reads.py                      # 400 jobs, no added latency, then 20 ms
    python benchmarks/bench_store_reads.py --jobs 2000 --latency-ms 0,20,50

A synthetic sweep (tests/helpers_report.py, every result.json with its generations' SHA-256, as a
worker writes it) is written to moto's S3 server on loopback. Then `load_sweep(...,
with_generations=False)` — what `decodebench report` and the submission server read first, one
result.json per job — runs with `read_concurrency` 1 and with S3Store's own (16), interleaved,
`--rounds` times each; medians. `--latency-ms` adds that much wait to every read (a sleep before
the request), the round trip to a real S3 endpoint that loopback does not have: moto answers in
about a millisecond, with its own CPU on the same cores, so the 0 ms ratio is the floor, not the
cluster's figure. The reports are checked equal.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write(store, n_jobs: int) -> tuple[str, str]:
    from tests.helpers_report import make_sweep, write_with_hashes

    n_cells = max(1, n_jobs // 4)  # 2 seeds x 2 shards of 4 prompts a cell
    cells = [("m", "top_p", {"p": round(0.5 + i / (2 * n_cells), 6)}) for i in range(n_cells)]
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=cells, shard_size=4, batch_size=4)
    write_with_hashes(store, data)
    return data.tenant, data.sweep_id


def timed(store, tenant: str, sweep: str, concurrency: int) -> tuple[float, list[str]]:
    from controller.report.aggregate import load_sweep

    store.read_concurrency = concurrency
    t0 = time.perf_counter()
    data = load_sweep(store, tenant, sweep, with_generations=False)
    return time.perf_counter() - t0, [r.job.job_id for r in data.results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--latency-ms", default="0,20", help="added wait per read, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import boto3

    from tests.services import s3_env, s3_server
    from worker.store import open_store
    from worker.store.s3 import S3Store

    threads = S3Store.read_concurrency
    with s3_server() as endpoint:
        os.environ.update(s3_env(endpoint))
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
        store = open_store("s3://bench/runs")
        t0 = time.perf_counter()
        tenant, sweep = write(store, args.jobs)
        print(f"moto S3 on loopback: {args.jobs} jobs written in {time.perf_counter() - t0:.0f} s; "
              f"{os.cpu_count()} CPUs; {args.rounds} rounds, medians")  # fmt: skip
        real = S3Store.read_bytes
        for latency in [float(x) / 1000 for x in args.latency_ms.split(",")]:

            def slow(self, key, latency=latency):
                time.sleep(latency)
                return real(self, key)

            S3Store.read_bytes = slow  # type: ignore[method-assign]
            times: dict[int, list[float]] = {1: [], threads: []}
            order = None
            for _ in range(args.rounds):
                for c in (1, threads):
                    wall, ids = timed(store, tenant, sweep, c)
                    assert order is None or ids == order, "the reads changed the report's jobs"
                    order = ids
                    times[c].append(wall)
            one, many = statistics.median(times[1]), statistics.median(times[threads])
            print(f"  +{latency * 1000:4.0f} ms a read: load_sweep one at a time {one:6.2f} s, "
                  f"{threads} in flight {many:6.2f} s: {one / many:.2f}x")  # fmt: skip
        S3Store.read_bytes = real  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
