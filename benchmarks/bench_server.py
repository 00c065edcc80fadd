"""The submission server against the direct enqueue it replaced, side by side in one run, on a
real redis-server and a real `decodebench serve` on loopback.

    python benchmarks/bench_server.py                # a 10,000-job sweep, 50 status clients
    python benchmarks/bench_server.py --jobs 2000    # smaller

- submit: the same sweep (fresh tenant-local ids each round) enqueued directly
  (`plan` + `enqueue_jobs`, what `decodebench submit` did with a tenant's Redis user)
  against POST /v1/sweeps through the server (the request carries the prompts inline; the
  server validates, plans, checks policy and quota, stores the spec and enqueues);
  median of `--rounds` each, interleaved; the ratio direct/server (target: the server at
  least 0.5x the direct speed, i.e. a ratio <= 2);
- status: `--clients` threads each asking GET /v1/sweeps/<id> `--requests` times: p50 and
  p99 latency and requests/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.launch.submit import enqueue_jobs  # noqa: E402
from controller.server.client import submission  # noqa: E402
from controller.sweep.load import parse_spec  # noqa: E402
from controller.sweep.plan import plan  # noqa: E402
from tests.support.server import deployment  # noqa: E402
from tests.support.services import redis_server  # noqa: E402

TENANTS = "tenants:\n  - {{name: team-a, rate_limit: 1000000}}\n  - {{name: team-b, rate_limit: 1000000}}\n"
KEY = b"bench-signing-key-0123456789abcdef0123456789"


def spec_for(n_jobs: int, round_: int):
    prompts = [f"Round {round_}, prompt {i}: it is a truth universally acknowledged" for i in range(n_jobs // 2)]
    return parse_spec(
        {
            "name": f"bench-server-{round_}",
            "models": [{"path": "/models/a", "name": "a"}],
            "prompts": {"inline": prompts, "shard_size": 1},
            "strategies": [{"name": "greedy"}, {"name": "top_k", "params": {"k": 40}}],
            "generation": {"max_new_tokens": 64, "seeds": [0]},
        }
    )


def direct(conn, n_jobs: int, round_: int) -> float:
    spec = spec_for(n_jobs, round_)
    start = time.perf_counter()
    out = enqueue_jobs(conn, plan(spec, "team-b"), "team-b", "normal", key=KEY)
    assert len(out.enqueued) == n_jobs
    return time.perf_counter() - start


def served(dep, n_jobs: int, round_: int) -> float:
    body = submission(spec_for(n_jobs, round_ + 1000), "normal", False)
    with dep.client("alice", timeout=600) as http:
        start = time.perf_counter()
        r = http.post("/v1/sweeps", json=body)
        took = time.perf_counter() - start
    assert r.status_code == 201 and r.json()["enqueued"] == n_jobs, r.text
    return took


def status_load(dep, sweep_id: str, clients: int, requests: int) -> None:
    latencies: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        mine = []
        with dep.client("alice", timeout=60) as http:
            for _ in range(requests):
                start = time.perf_counter()
                assert http.get(f"/v1/sweeps/{sweep_id}").status_code == 200
                mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    print(
        f"status under {clients} concurrent clients: {len(latencies):,} requests in {wall:.1f} s = "
        f"{len(latencies) / wall:,.0f} req/s; p50 {q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--requests", type=int, default=40, help="status requests per client")
    args = p.parse_args()

    import redis

    with tempfile.TemporaryDirectory() as tmp, redis_server() as (url, _):
        key_file = Path(tmp) / "key"
        key_file.write_bytes(KEY)
        conn = redis.Redis.from_url(url)
        extra = {"DECODEBENCH_MAX_JOBS": str(args.jobs * 2)}
        with deployment(Path(tmp) / "dep", url, str(key_file), "/models/a", tenants=TENANTS, **extra) as dep:
            served(dep, 200, -1)  # warm the server (imports, first plan)
            t_direct, t_served = [], []
            for r in range(args.rounds):
                t_direct.append(direct(conn, args.jobs, r))
                t_served.append(served(dep, args.jobs, r))
            d, s = statistics.median(t_direct), statistics.median(t_served)
            print(f"submit of a {args.jobs:,}-job sweep, median of {args.rounds}:")
            print(f"  direct enqueue (plan + enqueue_jobs) : {d:6.2f} s = {args.jobs / d:8,.0f} jobs/s")
            print(f"  through the submission server        : {s:6.2f} s = {args.jobs / s:8,.0f} jobs/s")
            print(f"  server speed / direct speed = {d / s:.2f}x (target >= 0.5x)")
            sweep_id = dep.client("alice").get("/v1/sweeps").json()[0]["sweep_id"]
            status_load(dep, sweep_id, args.clients, args.requests)


if __name__ == "__main__":
    main()
