"""The submission server and judge endpoints, on the real thing (`decodebench serve` on loopback, a real
redis-server): a tenant names a declared endpoint it is allowed, never a URL; anything else is refused in
one line and nothing is queued."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from controller.cli import main as cli
from tests.support.server import deployment
from worker.core import keys

pytestmark = pytest.mark.slow

TENANTS = """
tenants:
  - name: team-a
    models: [{model}]
    judges: [big-judge]
    rate_limit: 100000
  - name: team-b
    rate_limit: 100000
judges:
  - {{name: big-judge, url: "http://127.0.0.1:9/v1", api_key_file: /nonexistent/key}}
"""


def submit(dep, who: str, tmp, model: str, judge: dict):
    spec = {
        "name": "judged",
        "models": [{"path": model, "name": "tiny"}],
        "prompts": {"inline": ["It was the best of times", "Call me"], "shard_size": 2},
        "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
        "generation": {"max_new_tokens": 4, "batch_size": 2},
        "judge": {"model": "m", **judge},
    }
    path = tmp / "judged.json"
    path.write_text(json.dumps(spec))
    env = {"DECODEBENCH_API_URL": dep.url, "DECODEBENCH_TOKEN": dep.tokens[who]}
    return CliRunner().invoke(cli, ["submit", str(path)], env=env)


def queued(redis_url: str, tenant: str) -> int:
    conn = redis.Redis.from_url(redis_url)
    return sum(conn.llen(keys.rq_queue_key(q)) for q in keys.tenant_queues(tenant))


def test_judge_endpoints_are_the_operators(tmp_path, redis_url, signing_key_file, tiny_model):
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=TENANTS) as dep:
        for who, judge, why in [
            ("alice", {"endpoint": "nope"}, "'nope' is not a judge endpoint declared in the tenants file"),
            ("bob", {"endpoint": "big-judge"}, "tenant 'team-b' may not use judge endpoint 'big-judge'"),
            ("alice", {"url": "http://169.254.169.254/v1"}, "names a declared judge endpoint, not a URL"),
        ]:
            out = submit(dep, who, tmp_path, tiny_model, judge)
            assert out.exit_code == 2, out.output
            assert "HTTP 403" in out.output and why in out.output
            assert len(out.output.strip().splitlines()) == 1
        assert queued(redis_url, "team-a") == queued(redis_url, "team-b") == 0
        ok = submit(dep, "alice", tmp_path, tiny_model, {"endpoint": "big-judge"})
        assert ok.exit_code == 0, ok.output
        assert queued(redis_url, "team-a") > 0


def test_a_tenant_asks_the_server_for_its_judge_shares_within_the_budget(
    tmp_path, redis_url, signing_key_file, tiny_model
):
    """`report --distributed --api`'s judge call: the server plans the shares from the tenant's own stored sweep
    (it holds no key: the workers send), checks the whole report's budget first, and takes no settings."""
    from tests.support.report import make_sweep, write_with_hashes
    from worker.store import open_store

    cells = [("austen-tiny", "greedy", {}), ("austen-tiny", "top_p", {"p": 0.9}), ("austen-tiny", "top_k", {"k": 5})]
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=TENANTS) as dep:
        store = open_store(dep.extra["store"])
        for sweep_id, limits in (("sweepaaaaaaaaaaa", {}), ("sweepccccccccccc", {"max_requests": 5})):
            data = make_sweep(n_prompts=6, cells=cells, tenant="team-a", sweep_id=sweep_id)
            data.spec["judge"] = {"endpoint": "big-judge", "model": "m", "baseline": "greedy", "limits": limits}
            write_with_hashes(store, data)
        queue = keys.rq_queue_key(keys.report_queue("team-a"))
        conn = redis.Redis.from_url(redis_url)
        with dep.client("bob") as bob:
            assert bob.post("/v1/sweeps/sweepaaaaaaaaaaa/report-judges", json={}).status_code == 404
        with dep.client("alice", timeout=120) as alice:  # the first plan imports the report's code in the server
            r = alice.post("/v1/sweeps/sweepaaaaaaaaaaa/report-judges", json={"endpoint": "http://evil/v1"})
            assert r.status_code == 400, r.text  # the endpoint, its limits: the stored spec's, never the client's
            r = alice.post("/v1/sweeps/sweepccccccccccc/report-judges", json={})
            assert r.status_code == 400 and "over judge.limits.max_requests 5; raise it to 24" in r.json()["error"]
            assert conn.llen(queue) == 0
            r = alice.post("/v1/sweeps/sweepaaaaaaaaaaa/report-judges", json={})
            assert r.status_code == 200 and r.json()["enqueued"] == 2 and len(r.json()["names"]) == 2, r.text
        assert conn.llen(queue) == 2  # 2 compared cells, 24 requests: a share of whole cells each, one signed job each


def test_a_cancelled_sweep_submitted_again_takes_its_raised_judge_limits(
    tmp_path, redis_url, signing_key_file, tiny_model
):
    """docs/judge.md: a submitted sweep over the judge's budget is submitted again with the raised limits, then
    reported. Through the server, a cancelled sweep's submission returned before anything was written (it resumes
    only with --retry-failed), so its spec.json kept the old limits and `report SWEEP` stayed over budget for ever;
    `decodebench submit` without --api took them."""
    from worker.store import open_store

    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=TENANTS) as dep:
        judge = {"endpoint": "big-judge", "limits": {"max_requests": 2}}
        out = submit(dep, "alice", tmp_path, tiny_model, judge)
        assert out.exit_code == 0, out.output
        sweep_id = out.output.split()[1]
        env = {"DECODEBENCH_API_URL": dep.url, "DECODEBENCH_TOKEN": dep.tokens["alice"]}
        cancel = CliRunner().invoke(cli, ["cancel", sweep_id], env=env)
        assert cancel.exit_code == 0, cancel.output
        again = submit(dep, "alice", tmp_path, tiny_model, {**judge, "limits": {"max_requests": 50}})
        assert again.exit_code == 0 and "cancelled" in again.output, again.output
        assert queued(redis_url, "team-a") == 0  # still not resumed
        stored = open_store(dep.extra["store"]).load_spec("team-a", sweep_id)
        assert stored["spec"]["judge"]["limits"]["max_requests"] == 50
