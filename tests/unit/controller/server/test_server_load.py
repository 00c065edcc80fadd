"""The submission server under load, killed mid-submit, end to end with a real worker, and
with canary tokens: nothing lost, nothing doubled, no token anywhere it was not sent.

All against real processes on loopback: `decodebench serve`, redis-server,
`decodebench-worker --burst`; requests from many client threads at once (httpx).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import redis
from click.testing import CliRunner

from controller.cli import main as cli
from controller.server.client import submission
from controller.sweep.load import parse_spec
from tests.support.server import BIN, TOKENS, deployment
from worker.core import keys

pytestmark = pytest.mark.slow
CLIENTS = 20  # threads, 10 per tenant, each with its own token
REQUESTS = 100  # per client: 2,000 in all
LOAD_TENANTS = """
tenants:
  - {{name: team-a, models: [{model}], rate_limit: 100000, quota: {{sweeps_in_flight: 1000}}}}
  - {{name: team-b, rate_limit: 100000, quota: {{sweeps_in_flight: 1000}}}}
"""


def body(model: str, name: str, n_prompts: int = 4, shard_size: int = 2) -> dict:
    spec = parse_spec(
        {
            "name": name,
            "models": [{"path": model, "name": "tiny"}],
            "prompts": {
                "inline": [f"{name}: prompt {i} of the day" for i in range(n_prompts)],
                "shard_size": shard_size,
            },
            "strategies": [{"name": "greedy"}],
            "generation": {"max_new_tokens": 4, "batch_size": 2},
            "metrics": ["mean_length"],
        }
    )
    return submission(spec, "normal", False)


def queue_ids(conn, tenant: str) -> list[str]:
    return [i.decode() for q in keys.tenant_queues(tenant) for i in conn.lrange(keys.rq_queue_key(q), 0, -1)]


def test_twenty_clients_two_thousand_requests_nothing_lost_or_doubled(
    tmp_path, redis_url, signing_key_file, tiny_model
):
    clients = {f"{t}-{i}": {"tenant": t} for t in ("team-a", "team-b") for i in range(CLIENTS // 2)}
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=LOAD_TENANTS) as dep:
        dep.write_tokens({**TOKENS, **clients})
        time.sleep(1.2)  # the server re-reads the tokens file at most once a second
        errors: list[str] = []
        submitted: dict[str, set[str]] = {"team-a": set(), "team-b": set()}
        lock = threading.Lock()

        def client(name: str) -> None:
            tenant = clients[name]["tenant"]
            with dep.client(name, timeout=60) as http:
                for i in range(REQUESTS):
                    if i % 10 == 0:  # every client submits 10 sweeps of its own and polls in between
                        r = http.post("/v1/sweeps", json=body(tiny_model, f"{name}-{i}"))
                        if r.status_code == 201:
                            with lock:
                                submitted[tenant].add(r.json()["sweep_id"])
                    elif submitted[tenant] and i % 2:
                        r = http.get(f"/v1/sweeps/{sorted(submitted[tenant])[0]}")
                    else:
                        r = http.get("/v1/sweeps")
                    if r.status_code >= 300:
                        with lock:
                            errors.append(f"{name} {r.request.method} {r.request.url.path}: {r.status_code} {r.text}")

        threads = [threading.Thread(target=client, args=(n,)) for n in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not errors, errors[:5]
        conn = redis.Redis.from_url(redis_url)
        for tenant, sweeps in submitted.items():
            assert len(sweeps) == CLIENTS // 2 * REQUESTS // 10
            ids = queue_ids(conn, tenant)
            assert len(ids) == len(set(ids)) == 2 * len(sweeps)  # 2 jobs a sweep, each once
            with dep.client(f"{tenant}-0") as http:
                listed = {s["sweep_id"] for s in http.get("/v1/sweeps").json()}
            assert listed == sweeps


def test_a_server_killed_mid_submit_loses_nothing_and_a_resubmit_completes_it(
    tmp_path, redis_url, signing_key_file, tiny_model
):
    big = body(tiny_model, "big", n_prompts=30_000, shard_size=1)  # 30,000 jobs: six chunks of 5,000
    extra = {"DECODEBENCH_SUBMIT_LOCK_S": "2"}
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=LOAD_TENANTS, **extra) as dep:
        conn = redis.Redis.from_url(redis_url)

        def send() -> None:
            with contextlib.suppress(httpx.TransportError):  # the server is killed under it
                dep.client("alice", timeout=120).post("/v1/sweeps", json=big)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 120
        while not (n_at_kill := len(queue_ids(conn, "team-a"))):
            assert time.monotonic() < deadline
            time.sleep(0.002)
        dep.stop(kill=True)
        sender.join(timeout=60)
        assert 0 < n_at_kill < 30_000, n_at_kill
        dep.start()
        with dep.client("alice", timeout=300) as http:
            deadline = time.monotonic() + 30
            while (r := http.post("/v1/sweeps", json=big)).status_code == 409:  # the dead server's lock expires
                assert time.monotonic() < deadline
                time.sleep(0.5)
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["pending"] + out["enqueued"] == out["jobs"] == 30_000
            status = http.get(f"/v1/sweeps/{out['sweep_id']}").json()
        ids = queue_ids(conn, "team-a")
        assert len(ids) == len(set(ids)) == 30_000
        assert status["totals"]["queued"] == 30_000


def test_end_to_end_through_the_server_with_a_real_worker_and_canary_tokens(
    tmp_path, redis_url, signing_key_file, tiny_model
):
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=LOAD_TENANTS) as dep:
        spec = tmp_path / "sweep.json"
        spec.write_text(
            json.dumps(
                {
                    "name": "e2e",
                    "models": [{"path": tiny_model, "name": "tiny"}],
                    "prompts": {"inline": ["It was a dark", "She said that", "The house stood"], "shard_size": 2},
                    "strategies": [{"name": "greedy"}],
                    "generation": {"max_new_tokens": 6, "batch_size": 2},
                    "metrics": ["mean_length", "rep_2"],
                }
            )
        )
        env = {"DECODEBENCH_API_URL": dep.url, "DECODEBENCH_TOKEN": dep.tokens["alice"]}
        out = CliRunner().invoke(cli, ["submit", str(spec)], env=env)
        assert out.exit_code == 0, out.output
        sweep_id = out.output.split()[1]
        worker_env = {**dep.env, "DECODEBENCH_HEARTBEAT_TTL": "5", "DECODEBENCH_REAPER_INTERVAL": "0.5"}
        worker_env["DECODEBENCH_REDIS_URL"] = dep.env["DECODEBENCH_REDIS_URL"]
        proc = subprocess.run(
            [str(BIN / "decodebench-worker"), "--device", "cpu", "--burst"],
            env=worker_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        status = CliRunner().invoke(cli, ["status", sweep_id, "--json"], env=env)
        assert json.loads(status.output)["totals"]["done"] == 2
        report = CliRunner().invoke(cli, ["report", sweep_id, "--store", dep.extra["store"]], env=env)
        assert report.exit_code == 0, report.output
        assert "tiny" in report.output and "greedy" in report.output
        logs = [proc.stdout, proc.stderr, dep.log.read_text(), out.output, status.output, report.output]
        stored = [p.read_bytes().decode(errors="replace") for p in Path(dep.extra["store"]).rglob("*") if p.is_file()]
        dump = [repr(redis.Redis.from_url(redis_url).dump(k)) for k in redis.Redis.from_url(redis_url).keys("*")]
        for token in dep.tokens.values():
            for text in logs + stored + dump:
                assert token not in text
        assert (
            Counter(json.loads(x)["event"] for x in dep.log.read_text().splitlines() if x.startswith("{"))["audit"] >= 3
        )
