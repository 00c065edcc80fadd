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
