"""The submission server on the real thing: `decodebench serve` as a subprocess on loopback,
a real redis-server, the CLI's `--api` mode in-process. Each attack of issue 23 that the
server answers is a test here: a tenant reaches only its own sweeps, every model a job loads
is held to the tenant's allowlist, cost and quota are refused at submit in one line, and
nothing is written to Redis for a refused request.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import redis
from click.testing import CliRunner

from controller.cli import main as cli
from tests.support.server import deployment
from worker.core import keys

pytestmark = pytest.mark.slow


def write_spec(tmp: Path, model: str, name: str = "served", **overrides) -> Path:
    spec = {
        "name": name,
        "models": [{"path": model, "name": "tiny"}],
        "prompts": {"inline": [f"It was the {i}th of May and" for i in range(6)], "shard_size": 2},
        "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
        "generation": {"max_new_tokens": 8, "batch_size": 2, "seeds": [1, 2]},
        "metrics": ["mean_length", "rep_2"],
    }
    spec.update(overrides)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture()
def dep(tmp_path, redis_url, signing_key_file, tiny_model):
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model) as d:
        yield d


def cli_as(dep, who: str | None, *args: str):
    env = {"DECODEBENCH_API_URL": dep.url}
    if who:
        env["DECODEBENCH_TOKEN"] = dep.tokens[who]
    return CliRunner().invoke(cli, list(args), env=env)


def queued(redis_url: str, tenant: str) -> int:
    conn = redis.Redis.from_url(redis_url)
    return sum(conn.llen(keys.rq_queue_key(q)) for q in keys.tenant_queues(tenant))


def test_submit_through_the_server_keeps_the_sweep_id_and_enqueues_signed_jobs(dep, tmp_path, tiny_model, redis_url):
    from controller.sweep.load import load_spec
    from controller.sweep.plan import plan
    from worker.core.signing import SIG_FIELD

    spec_path = write_spec(tmp_path, tiny_model)
    result = cli_as(dep, "alice", "submit", str(spec_path))
    assert result.exit_code == 0, result.output
    expected = plan(load_spec(spec_path), "team-a")
    assert f"sweep {expected[0].sweep_id} submitted: {len(expected)} jobs" in result.output
    assert queued(redis_url, "team-a") == len(expected)
    conn = redis.Redis.from_url(redis_url)
    assert all(conn.hget(keys.rq_job_key("team-a", j.job_id), SIG_FIELD) for j in expected)
    again = cli_as(dep, "alice", "submit", str(spec_path))
    assert again.exit_code == 0 and "already submitted" in again.output and "0 jobs enqueued now" in again.output
    assert queued(redis_url, "team-a") == len(expected)  # idempotent
    status = cli_as(dep, "alice", "status", expected[0].sweep_id[:8], "--json")
    assert json.loads(status.output)["totals"]["queued"] == len(expected)


def test_a_tenant_reaches_only_its_own_sweeps(dep, tmp_path, tiny_model, redis_url):
    out = cli_as(dep, "alice", "submit", str(write_spec(tmp_path, tiny_model)))
    sweep_id = out.output.split()[1]
    for args in (["status", sweep_id], ["cancel", sweep_id], ["retry", sweep_id], ["failures", sweep_id]):
        result = cli_as(dep, "bob", *args)
        assert result.exit_code == 2, result.output
        assert (
            result.output.strip() == f"error: HTTP 404: no submitted sweep {sweep_id!r} for tenant 'team-b' "
            "(see `decodebench submit`)"
        )
    assert queued(redis_url, "team-a") > 0  # bob's cancel dropped nothing
    shares = cli_as(dep, "alice", "status", "--all-tenants")
    assert shares.exit_code == 2 and "HTTP 403" in shares.output and "not an admin token" in shares.output
    rows = json.loads(cli_as(dep, "ops", "status", "--all-tenants", "--json").output)
    assert {r["tenant"] for r in rows} == {"team-a", "team-b"}


def test_tokens_are_required_and_the_tenant_comes_from_the_token(dep, tmp_path, tiny_model):
    spec = str(write_spec(tmp_path, tiny_model))
    missing = cli_as(dep, None, "submit", spec)
    assert missing.exit_code == 2 and "no token for the submission server" in missing.output
    wrong = CliRunner().invoke(cli, ["status", "x", "--api", dep.url], env={"DECODEBENCH_TOKEN": "dbt_nope"})
    assert wrong.exit_code == 2
    assert wrong.output.strip() == "error: HTTP 401: the token is not valid (unknown, revoked or mistyped)"
    tenant = cli_as(dep, "alice", "submit", spec, "--tenant", "team-b")
    assert tenant.exit_code == 2 and "with --api the tenant comes from your token" in tenant.output
    raw = httpx.get(f"{dep.url}/v1/sweeps")
    assert raw.status_code == 401 and raw.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "override, reason",
    [
        ({"scorer": {"path": "gpt2"}}, "refused: scorer 'gpt2' is not among tenant team-a's models"),
        ({"featurizer": {"path": "gpt2"}}, "refused: featurizer 'gpt2'"),
        ({"models": [{"path": "gpt2", "name": "tiny"}]}, "refused: model 'gpt2'"),
        ({"strategies": [{"name": "assisted", "params": {"assistant": "gpt2"}}]}, "refused: assistant 'gpt2'"),
        ({"strategies": [{"name": "beam", "params": {"num_beams": 2147483647}}]}, "num_beams=2147483647 is over"),
        ({"strategies": [{"name": "contrastive", "params": {"k": 2147483647}}]}, "k=2147483647 is over the limit"),
    ],
)
def test_policy_is_checked_on_every_model_and_every_cost_at_submit(
    dep, tmp_path, tiny_model, redis_url, override, reason
):
    spec = write_spec(tmp_path, tiny_model, **override)
    result = cli_as(dep, "alice", "submit", str(spec), "--remote-paths")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: HTTP 403: cell ") and reason in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert queued(redis_url, "team-a") == 0
    assert not redis.Redis.from_url(redis_url).keys("decodebench:team-a:sweep:*")


def test_a_generation_past_the_models_positions_is_refused_at_submit_and_validate(dep, tmp_path, tiny_model, redis_url):
    long_prompt = "word " * 200  # about 200 tokens: with 64 new ones, past the bundled model's 256 positions
    spec = write_spec(
        tmp_path, tiny_model, prompts={"inline": ["short", long_prompt]}, generation={"max_new_tokens": 64}
    )
    result = cli_as(dep, "alice", "submit", str(spec))
    assert result.exit_code == 2, result.output
    assert (
        "HTTP 400: generation.max_new_tokens: model 'tiny' takes 256 positions: the longest prompt (" in result.output
    )
    assert queued(redis_url, "team-a") == 0
    local = CliRunner().invoke(cli, ["validate", str(spec)])
    assert local.exit_code == 2 and "takes 256 positions" in local.output


def test_trust_remote_code_is_refused_unless_the_tenant_allows_it(dep, tmp_path, tiny_model, redis_url):
    spec = write_spec(tmp_path, tiny_model, models=[{"path": tiny_model, "name": "tiny", "trust_remote_code": True}])
    result = cli_as(dep, "alice", "submit", str(spec))
    assert result.exit_code == 2 and "HTTP 403" in result.output and "trust_remote_code" in result.output
    assert queued(redis_url, "team-a") == 0


def test_quotas_refuse_in_one_line_and_write_nothing(dep, tmp_path, tiny_model, redis_url):
    prompts = [f"Prompt number {i} of the big sweep" for i in range(500)]
    big = write_spec(tmp_path, tiny_model, "big", prompts={"inline": prompts, "shard_size": 1})
    result = cli_as(dep, "alice", "submit", str(big))
    assert result.exit_code == 2, result.output
    # larger than the whole quota: refused from its counts, before it is planned (issue 39)
    assert "HTTP 429: over quota: the sweep plans 1500 jobs; tenant team-a's quota.queued_jobs is 400" in result.output
    assert queued(redis_url, "team-a") == 0
    for i in range(5):  # sweeps_in_flight: 5
        assert cli_as(dep, "alice", "submit", str(write_spec(tmp_path, tiny_model, f"s{i}"))).exit_code == 0
    sixth = cli_as(dep, "alice", "submit", str(write_spec(tmp_path, tiny_model, "s5")))
    assert sixth.exit_code == 2 and "quota.sweeps_in_flight is 5" in sixth.output
    other = cli_as(dep, "bob", "submit", str(write_spec(tmp_path, tiny_model, "s5")))
    assert other.exit_code == 0, other.output  # team-b's quota is its own


def test_requests_are_size_limited_before_parsing_and_prompt_paths_refused(
    tmp_path, redis_url, signing_key_file, tiny_model
):
    extra = {"DECODEBENCH_API_MAX_REQUEST_MB": "1"}
    with (
        deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, **extra) as dep,
        dep.client("alice") as client,
    ):
        declared = client.post("/v1/sweeps", content=b"{" + b" " * (3 * 2**19) + b"}")
        assert declared.status_code == 413 and "over the limit of 1 MiB" in declared.json()["error"]
        chunked = client.post("/v1/sweeps", content=iter([b"{", b" " * 2**19, b" " * 2**19, b" " * 2**19, b"}"]))
        assert chunked.status_code == 413
        assert queued(redis_url, "team-a") == 0
        bad = client.post("/v1/sweeps", content=b"[[[[")
        assert bad.status_code == 400 and bad.json()["error"].startswith("request body: not JSON")
        spec = json.loads(write_spec(tmp_path, tiny_model).read_text())
        spec["prompts"] = {"path": "/etc/passwd"}
        path = client.post("/v1/sweeps", json={"spec": spec})
        assert path.status_code == 400 and "the server reads no file a client names" in path.json()["error"]


def test_rate_limit_per_token(tmp_path, redis_url, signing_key_file, tiny_model):
    tenants = "tenants:\n  - {{name: team-a, rate_limit: 3}}\n  - {{name: team-b}}\n"
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model, tenants=tenants) as dep:
        with dep.client("alice") as client:
            codes = [client.get("/v1/sweeps").status_code for _ in range(4)]
            assert codes == [200, 200, 200, 429]
            last = client.get("/v1/sweeps")
            assert "rate limit: token alice made 5 requests this minute; the limit is 3" in last.json()["error"]
            assert 1 <= int(last.headers["retry-after"]) <= 60
        with dep.client("bob") as client:
            assert client.get("/v1/sweeps").status_code == 200  # per token


def test_tokens_rotate_without_a_restart(dep):
    from tests.support.server import TOKENS

    old = dep.tokens["alice"]
    dep.write_tokens({**TOKENS, "alice-2": {"tenant": "team-a"}})
    deadline = __import__("time").monotonic() + 10
    with dep.client("alice-2") as client:
        while client.get("/v1/whoami").status_code != 200:
            assert __import__("time").monotonic() < deadline, "the new token was not picked up"
        assert client.get("/v1/whoami").json() == {"token_id": "alice-2", "tenant": "team-a", "admin": False}
    with dep.client("alice") as client:
        assert client.get("/v1/whoami").status_code == 200  # both valid during the rotation
    del dep.tokens["alice"]
    dep.write_tokens({k: v for k, v in TOKENS.items() if k != "alice"} | {"alice-2": {"tenant": "team-a"}})
    headers = {"Authorization": f"Bearer {old}"}
    while httpx.get(f"{dep.url}/v1/whoami", headers=headers).status_code != 401:
        assert __import__("time").monotonic() < deadline + 10, "the removed token still works"


def test_every_request_leaves_one_audit_line_and_no_token(dep, tmp_path, tiny_model):
    cli_as(dep, "alice", "submit", str(write_spec(tmp_path, tiny_model)))
    cli_as(dep, "bob", "status", "nope")
    dep.stop()
    lines = [json.loads(x) for x in dep.log.read_text().splitlines() if x.startswith("{")]
    audit = [x for x in lines if x.get("event") == "audit"]
    submit = next(x for x in audit if x["action"] == "submit")
    assert submit["tenant"] == "team-a" and submit["user"] == "alice" and submit["status"] == 201
    assert len(submit["sweep_id"]) == 16
    refused = next(x for x in audit if x["action"] == "status")
    assert refused["user"] == "bob" and refused["status"] == 404 and "no submitted sweep" in refused["result"]
    text = dep.log.read_text()
    for tok in dep.tokens.values():
        assert tok not in text


def test_bad_server_files_are_one_line(tmp_path, redis_url, signing_key_file, tiny_model):
    from tests.support.server import BIN, server_env

    (tmp_path / "tenants.yaml").write_text('tenants:\n  - name: "team-a\\n"\n')
    (tmp_path / "tokens.yaml").write_text("tokens: []\n")
    env = server_env(tmp_path, redis_url, str(tmp_path / "runs"), signing_key_file)
    import subprocess

    proc = subprocess.run([str(BIN / "decodebench"), "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "tenants[0].name: tenant 'team-a\\n' must be" in proc.stderr
    (tmp_path / "tenants.yaml").write_text("tenants:\n  - name: worker\n")
    proc = subprocess.run([str(BIN / "decodebench"), "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "'worker' is reserved" in proc.stderr
    (tmp_path / "tenants.yaml").write_text("tenants:\n  - name: team-a\n")
    (tmp_path / "tokens.yaml").write_text("tokens:\n  - {id: a, tenant: team-a, sha256: not-a-hash}\n")
    proc = subprocess.run([str(BIN / "decodebench"), "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "tokens[0].sha256: must be the 64 lower-case hex digits" in proc.stderr


def test_an_unreachable_server_is_exit_1(tmp_path, tiny_model):
    from tests.support.services import free_port

    env = {"DECODEBENCH_TOKEN": "dbt_x", "DECODEBENCH_API_RETRIES": "1"}
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["status", "abc", "--api", url], env=env)
    assert result.exit_code == 1
    assert result.output.startswith(f"error: cannot reach the submission server at {url}")


def test_a_mixed_engine_sweep_through_the_server_lands_on_each_engines_queue(dep, tmp_path, tiny_model, redis_url):
    engines = [{"name": "decodebench"}, {"name": "vllm", "dtype": "float32", "max_model_len": 256}]
    result = cli_as(dep, "alice", "submit", str(write_spec(tmp_path, tiny_model, engines=engines)))
    assert result.exit_code == 0, result.output
    assert "decodebench.team-a.normal, decodebench.team-a.normal.vllm" in result.output
    conn = redis.Redis.from_url(redis_url)
    for queue in ("decodebench.team-a.normal", "decodebench.team-a.normal.vllm"):
        ids = [i.decode() for i in conn.lrange(keys.rq_queue_key(queue), 0, -1)]
        engines_of = {
            json.loads(conn.hget(keys.rq_job_key("team-a", i), "meta"))["cell"].endswith("::vllm") for i in ids
        }
        assert len(ids) == 9 and engines_of == {queue.endswith(".vllm")}, queue  # greedy: one seed
