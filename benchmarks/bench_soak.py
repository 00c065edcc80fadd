"""Soak: mixed submit/cancel/retry/status/log traffic of two tenants beside a third, on a real redis-server
and a real `decodebench serve` on loopback (issue 39). What one tenant can cost the others, measured.

    python benchmarks/bench_soak.py                 # 60 s of traffic
    python benchmarks/bench_soak.py --seconds 20    # shorter

- The victim (team-c) asks GET /v1/sweeps/<id> in a loop: its latency alone first (p50, p99), then while
  team-a and team-b each loop submit (a fresh 120-job sweep of ~4 KB prompts) / cancel / retry / status /
  logs (a 0.6 MB log of 200,000 empty lines planted in their prefix, under the server's log limit) for
  `--seconds`; the ratio of the victim's p50 and p99 under load to alone.
- Redis `used_memory` and the server's RSS sampled every round: first, maximum and last, and the growth
  over the second half of the soak (flat where retention and the quotas hold).
"""

from __future__ import annotations

import argparse
import base64
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psutil  # noqa: E402
import redis  # noqa: E402

from tests.support.server import deployment  # noqa: E402
from tests.support.services import redis_server  # noqa: E402
from worker.core import paths  # noqa: E402
from worker.store import FileStore  # noqa: E402

QUOTA = "{{queued_jobs: 5000, queued_mb: 64, sweeps_in_flight: 5, held_jobs: 600}}"
TENANTS = "tenants:\n" + "".join(
    f"  - {{{{name: {t}, rate_limit: 1000000, quota: {QUOTA}}}}}\n" for t in ("team-a", "team-b", "team-c")
)
TOKENS = {"a": {"tenant": "team-a"}, "b": {"tenant": "team-b"}, "c": {"tenant": "team-c"}}
KEY = b"bench-signing-key-0123456789abcdef0123456789"


def body(name: str, n_prompts: int = 40, chars: int = 4000) -> dict:
    rng = random.Random(name)
    prompts = [base64.b64encode(rng.randbytes(chars)).decode()[:chars] for _ in range(n_prompts)]
    spec = {
        "name": name,
        "models": [{"path": "gpt2", "name": "hub"}],
        "prompts": {"inline": prompts, "shard_size": 1},
        "strategies": [{"name": "greedy"}, {"name": "top_k", "params": {"k": [5, 10]}}],
        "generation": {"max_new_tokens": 4, "batch_size": 2},
        "metrics": ["mean_length"],
    }
    return {"spec": spec}


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else float("nan")


def victim(http: httpx.Client, sweep_id: str, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        assert http.get(f"/v1/sweeps/{sweep_id}").status_code == 200
        out.append((time.perf_counter() - t) * 1000)


def attacker(http: httpx.Client, store: FileStore, tenant: str, stop: threading.Event, counts: dict) -> None:
    i = 0
    while not stop.is_set():
        r = http.post("/v1/sweeps", json=body(f"{tenant}-{i}"))
        counts[r.status_code] = counts.get(r.status_code, 0) + 1
        if r.status_code in (200, 201):
            sweep_id = r.json()["sweep_id"]
            job = store.read_json(paths.plan_key(tenant, sweep_id))["jobs"][0]["job_id"]
            store.write_bytes(paths.log_key(tenant, sweep_id, job), b"{}\n" * 200_000)
            calls = [
                ("POST", f"/v1/sweeps/{sweep_id}/cancel", {}),
                ("POST", f"/v1/sweeps/{sweep_id}/retry", {"json": {}}),
                ("POST", f"/v1/sweeps/{sweep_id}/cancel", {}),
                ("GET", f"/v1/sweeps/{sweep_id}", {}),
                ("GET", f"/v1/jobs/{job}/log", {"params": {"sweep": sweep_id}}),
            ]
            for method, path, kwargs in calls:
                code = http.request(method, path, **kwargs).status_code
                counts[code] = counts.get(code, 0) + 1
        i += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--alone", type=float, default=10.0, help="seconds of the victim alone")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, redis_server() as (url, _):
        key_file = Path(tmp) / "key"
        key_file.write_bytes(KEY)
        conn = redis.Redis.from_url(url)
        with deployment(Path(tmp) / "dep", url, str(key_file), "gpt2", tenants=TENANTS) as dep:
            dep.write_tokens(TOKENS)
            time.sleep(1.2)
            server = psutil.Process(dep.proc.pid)
            store = FileStore(dep.extra["store"])
            clients = {w: dep.client(w, timeout=120) for w in TOKENS}
            victim_sweep = clients["c"].post("/v1/sweeps", json=body("victim", n_prompts=4, chars=50)).json()
            alone: list[float] = []
            stop = threading.Event()
            t = threading.Thread(target=victim, args=(clients["c"], victim_sweep["sweep_id"], stop, alone))
            t.start()
            time.sleep(args.alone)
            stop.set()
            t.join()
            loaded: list[float] = []
            counts: dict[int, int] = {}
            stop = threading.Event()
            threads = [threading.Thread(target=victim, args=(clients["c"], victim_sweep["sweep_id"], stop, loaded))]
            threads += [
                threading.Thread(target=attacker, args=(clients[w], store, f"team-{w}", stop, counts)) for w in "ab"
            ]
            for th in threads:
                th.start()
            samples = []
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                samples.append((conn.info("memory")["used_memory"], server.memory_info().rss))
                time.sleep(1)
            stop.set()
            for th in threads:
                th.join()
            half = samples[len(samples) // 2 :]
            p50, p99 = (pct(alone, 50), pct(loaded, 50)), (pct(alone, 99), pct(loaded, 99))
            print(
                f"victim status p50 alone {p50[0]:.1f} ms, under load {p50[1]:.1f} ms (ratio {p50[1] / p50[0]:.2f}); "
                f"p99 {p99[0]:.1f} -> {p99[1]:.1f} ms (ratio {p99[1] / p99[0]:.2f}); {len(alone)} and {len(loaded)} "
                "requests"
            )
            for name, i in (("redis used_memory", 0), ("server RSS", 1)):
                xs, late = [s[i] / 2**20 for s in samples], [s[i] / 2**20 for s in half]
                print(
                    f"{name}: first {xs[0]:.1f} MiB, max {max(xs):.1f} MiB, last {xs[-1]:.1f} MiB; "
                    f"second half {min(late):.1f}-{max(late):.1f} MiB"
                )
            print(f"attackers' answers by status: {dict(sorted(counts.items()))}")
            for c in clients.values():
                c.close()


if __name__ == "__main__":
    main()
