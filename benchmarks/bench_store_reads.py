"""The report's reads from S3: one at a time vs the store's `read_concurrency` in flight, side by side.

    python benchmarks/bench_store_reads.py                      # 400 jobs, no added latency, then 20 ms
    python benchmarks/bench_store_reads.py --jobs 2000 --latency-ms 0,20,50

A synthetic sweep (tests/support/report.py, every result.json with its generations' SHA-256, as a
worker writes it) is written to moto's S3 server on loopback. Then `load_sweep(...,
with_generations=False)` — what `decodebench report` and the submission server read first, one
result.json per job — runs with `read_concurrency` 1 and with S3Store's own (16), interleaved,
`--rounds` times each; medians. `--latency-ms` adds that much wait to every read (a sleep before
the request), the round trip to a real S3 endpoint that loopback does not have: moto answers in
about a millisecond, with its own CPU on the same cores, so the 0 ms ratio is the floor, not the
cluster's figure. The reports are checked equal.

Then the planner's second call (`report --distributed` asks for the cells, then the pairs): the
pairs planned from the store (`plan_pairs` without a memo: every result.json read again) against
from the memo the cells' call left (controller.report.distribute.plancache: the sweep's listing only, to check
its fingerprint), at each latency; a listing is charged the latency once per 1,000 keys, as S3's
pages. The plans are checked equal.

Each also from the sweep's results snapshot (controller.report.load.snapshot: every result unchanged since
the last load comes from one object, `report/cache/results.jsonl.gz`; the cold loads delete it first): a
report of a sweep that grew or had a retry reads only what changed.
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
    from tests.support.report import make_sweep, write_with_hashes

    n_cells = max(1, n_jobs // 4)  # 2 seeds x 2 shards of 4 prompts a cell
    cells = [("m", "top_p", {"p": round(0.5 + i / (2 * n_cells), 6)}) for i in range(n_cells)]
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=cells, shard_size=4, batch_size=4)
    write_with_hashes(store, data)
    return data.tenant, data.sweep_id


def timed(store, tenant: str, sweep: str, concurrency: int, snapshot: bool = False) -> tuple[float, list[str]]:
    """One load_sweep's wall time and jobs: cold (the sweep's results snapshot deleted first), or from the
    snapshot the previous load left."""
    from controller.report import snapshot as snap
    from controller.report.load.sweep import load_sweep

    store.read_concurrency = concurrency
    if not snapshot:
        store.delete(snap.key_of(tenant, sweep))
    t0 = time.perf_counter()
    data = load_sweep(store, tenant, sweep, with_generations=False)
    return time.perf_counter() - t0, [r.job.job_id for r in data.results]


def plans(store, tenant: str, sweep: str, rounds: int) -> tuple[float, ...]:
    """Medians of `plan_pairs` from the store (cold), from the results snapshot and from a warm memo
    (interleaved)."""
    from controller.report.distribute.plancache import PlanMemo
    from controller.report.distribute.signer import plan_pairs
    from controller.report.load import snapshot

    memo, times, found = PlanMemo(), {"store": [], "snapshot": [], "memo": []}, []
    settings = {"n_boot": 100, "seed": 0, "n_boot_corpus": 100, "baseline": None}
    plan_pairs(store, tenant, sweep, memo=memo, **settings)  # the cells' call's plan, remembered
    for _ in range(rounds):
        for how in ("store", "snapshot", "memo"):
            if how == "store":
                store.delete(snapshot.key_of(tenant, sweep))
            t0 = time.perf_counter()
            found.append(plan_pairs(store, tenant, sweep, memo=memo if how == "memo" else None, **settings))
            times[how].append(time.perf_counter() - t0)
    assert all(f == found[0] for f in found), "the memo's plan is not the store's"
    return tuple(statistics.median(times[how]) for how in ("store", "snapshot", "memo"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--latency-ms", default="0,20", help="added wait per read, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import boto3

    from tests.support.services import s3_env, s3_server
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
        real, real_list = S3Store.read_bytes, S3Store.list_versions
        for latency in [float(x) / 1000 for x in args.latency_ms.split(",")]:

            def slow(self, key, latency=latency):
                time.sleep(latency)
                return real(self, key)

            def listing(self, prefix, latency=latency):
                found = real_list(self, prefix)
                time.sleep(latency * (1 + len(found) // 1000))  # a page of 1,000 keys a round trip
                return found

            S3Store.read_bytes, S3Store.list_versions = slow, listing  # type: ignore[method-assign]
            times: dict[object, list[float]] = {1: [], threads: [], "snapshot": []}
            order = None
            for _ in range(args.rounds):
                for c in (1, threads, "snapshot"):
                    wall, ids = timed(store, tenant, sweep, threads if c == "snapshot" else c, c == "snapshot")
                    assert order is None or ids == order, "the reads changed the report's jobs"
                    order = ids
                    times[c].append(wall)
            one, many, warm = (statistics.median(times[c]) for c in (1, threads, "snapshot"))
            print(f"  +{latency * 1000:4.0f} ms a read: load_sweep one at a time {one:6.2f} s, "
                  f"{threads} in flight {many:6.2f} s: {one / many:.2f}x; "
                  f"from the results snapshot {warm:6.2f} s: {many / warm:.1f}x over {threads} in flight")  # fmt: skip
            planned, snapped, remembered = plans(store, tenant, sweep, args.rounds)
            print(f"  +{latency * 1000:4.0f} ms a read: the pairs planned from the store {planned:6.2f} s, "
                  f"from the results snapshot {snapped:6.2f} s ({planned / snapped:.1f}x), "
                  f"from the memo {remembered:6.2f} s ({planned / remembered:.1f}x)")  # fmt: skip
        S3Store.read_bytes, S3Store.list_versions = real, real_list  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
