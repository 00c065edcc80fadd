"""Nothing a tenant sends or stores grows what the tenants share (issue 39): each attack is a test on real
processes (`decodebench serve` on loopback, redis-server, the file store and the S3 endpoint), and each
fails on the code before its fix.

- Retention: a cancelled job keeps no payload, and what Redis records for a tenant is held to
  quota.held_jobs (its oldest idle sweeps forgotten first): Redis memory stays flat over a submit/cancel loop.
- Bounded reads: the store refuses an object over its read limit before reading it (file and S3), a FIFO
  planted in the store is refused, not waited on; the log endpoint has its own limit.
- Retry plans a stored spec with submit's checks: a rewritten spec.json naming a server file is one line
  that says nothing of the file.
- Cheap refusal: a sweep larger than the whole quota is refused from counts; a body of too many JSON values
  is refused before it is parsed.
- The edges: a connection trickling its headers is closed; /openapi.json is off (and behind a token when
  on); a same-size, same-mtime edit of the tokens file takes effect.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import socket
import threading
import time

import httpx
import pytest
import redis

from tests.support.server import deployment, token
from worker.core import keys, paths
from worker.core.errors import RecordTooLargeError, StoreError
from worker.store import FileStore, open_store

pytestmark = pytest.mark.slow
HELD = 240  # quota.held_jobs of both tenants below: two sweeps of the loop's size
QUOTA = f"{{{{queued_jobs: 2000, queued_mb: 64, sweeps_in_flight: 5, held_jobs: {HELD}}}}}"
BOUNDS_TENANTS = f"""
tenants:
  - name: team-a
    models: [{{model}}]
    quota: {QUOTA}
    rate_limit: 100000
  - name: team-b
    quota: {QUOTA}
    rate_limit: 100000
"""
HUB = "gpt2"  # team-b's model: a hub id, so the server reads no model file (no context check) for it


def sweep_body(model: str, name: str, n_prompts: int = 40, chars: int = 4000, **spec) -> dict:
    """A sweep of 3 cells x n_prompts jobs (one prompt each) of `chars` random, hardly compressible characters."""
    rng = random.Random(name)
    text = lambda: base64.b64encode(rng.randbytes(chars)).decode()[:chars]
    body = {
        "name": name,
        "models": [{"path": model, "name": "tiny"}],
        "prompts": {"inline": [text() for _ in range(n_prompts)], "shard_size": 1},
        "strategies": [{"name": "greedy"}, {"name": "top_k", "params": {"k": [5, 10]}}],
        "generation": {"max_new_tokens": 4, "batch_size": 2},
        "metrics": ["mean_length"],
    }
    body.update(spec)
    return {"spec": body}


@pytest.fixture()
def serve(tmp_path, redis_url, signing_key_file, tiny_model):
    """A server with these DECODEBENCH_* settings: `with serve(NAME=value) as dep:`."""
    return lambda name="dep", **env: deployment(
        tmp_path / name, redis_url, signing_key_file, tiny_model, tenants=BOUNDS_TENANTS, **env
    )


@pytest.fixture()
def dep(serve):
    with serve() as d:
        yield d


# -- retention ---------------------------------------------------------------------------------


def test_submit_and_cancel_in_a_loop_keeps_redis_memory_flat(dep, redis_url):
    conn = redis.Redis.from_url(redis_url)
    used = []
    with dep.client("bob", timeout=120) as http:
        for i in range(14):
            r = http.post("/v1/sweeps", json=sweep_body(HUB, f"loop-{i}"))
            assert r.status_code == 201, r.text
            sweep_id = r.json()["sweep_id"]
            assert r.json()["enqueued"] == 120
            assert http.post(f"/v1/sweeps/{sweep_id}/cancel").json()["dropped"] == 120
            used.append(conn.info("memory")["used_memory"])
        # each round adds ~0.4 MB of payloads; the last rounds hold no more than the third did
        assert max(used[-4:]) - used[2] < 400_000, used
        # a cancelled job keeps no payload, and its hash expires
        job_key = next(iter(conn.scan_iter(match=keys.rq_job_key("team-b", "*"), count=1000)))
        assert conn.hget(job_key, "data") is None and conn.ttl(job_key) > 0
        # what Redis records for the tenant stays within quota.held_jobs: the oldest sweeps were forgotten
        live = http.get("/v1/sweeps").json()
        assert sum(s["jobs"] for s in live) <= HELD and [s["name"] for s in live][-1] == "loop-13"
        assert len(list(conn.scan_iter(match=keys.rq_job_key("team-b", "*"), count=1000))) <= HELD


def test_a_sweep_whose_live_jobs_fill_the_quota_is_refused_in_one_line(dep):
    with dep.client("bob", timeout=120) as http:
        assert http.post("/v1/sweeps", json=sweep_body(HUB, "live-1", chars=20)).status_code == 201
        assert http.post("/v1/sweeps", json=sweep_body(HUB, "live-2", chars=20)).status_code == 201
        r = http.post("/v1/sweeps", json=sweep_body(HUB, "live-3", chars=20))
    assert r.status_code == 429 and "quota.held_jobs is 240" in r.json()["error"]
    assert "\n" not in r.json()["error"]


# -- bounded reads -----------------------------------------------------------------------------


def _read_limits(store, monkeypatch):
    monkeypatch.setenv("DECODEBENCH_STORE_MAX_READ_MB", "0.5")
    store.write_bytes("team-a/planted.bin", b"x" * (600 * 1024))
    store.write_bytes("team-a/small.bin", b"y" * 1000)
    with pytest.raises(RecordTooLargeError, match=r"planted\.bin: 614,400 bytes or more, over the read limit"):
        store.read_bytes("team-a/planted.bin")
    assert store.read_bytes("team-a/small.bin") == b"y" * 1000
    with pytest.raises(RecordTooLargeError):
        store.read_bytes("team-a/small.bin", limit=999)


def test_the_file_store_refuses_an_object_over_its_read_limit_and_never_waits_on_a_fifo(tmp_path, monkeypatch):
    store = FileStore(tmp_path / "runs")
    _read_limits(store, monkeypatch)
    fifo = tmp_path / "runs" / "team-a" / "sweeps" / "s" / "spec.json"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    outcome: list = []

    def read() -> None:
        try:
            outcome.append(store.read_bytes("team-a/sweeps/s/spec.json"))
        except StoreError as err:
            outcome.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # the old code blocks on the FIFO until someone writes to it
        with open(fifo, "wb"):
            pass
        reader.join(5)
        pytest.fail("reading a FIFO planted in the store blocked")
    assert isinstance(outcome[0], StoreError) and "is not a regular file" in str(outcome[0])


def test_the_s3_store_refuses_an_object_over_its_read_limit(s3_bucket, monkeypatch):
    _read_limits(open_store(f"s3://{s3_bucket}/runs"), monkeypatch)


def _submitted(dep, http, model: str, name: str) -> tuple[str, str]:
    """(sweep id, its first job's id) of a small sweep submitted as `http`'s tenant (team-a)."""
    r = http.post("/v1/sweeps", json=sweep_body(model, name, n_prompts=2, chars=20))
    assert r.status_code == 201, r.text
    sweep_id = r.json()["sweep_id"]
    store = FileStore(dep.extra["store"])
    job_id = json.loads(store.read_bytes(paths.plan_key("team-a", sweep_id)))["jobs"][0]["job_id"]
    return sweep_id, job_id


def test_the_log_endpoint_refuses_a_log_over_its_limit_before_reading_it(serve, tiny_model):
    with serve(DECODEBENCH_API_MAX_LOG_MB="0.25") as dep, dep.client("alice", timeout=60) as http:
        sweep_id, job_id = _submitted(dep, http, tiny_model, "logs")
        store = FileStore(dep.extra["store"])
        store.write_bytes(paths.log_key("team-a", sweep_id, job_id), b"{}\n" * 200_000)  # 600 KB of empty lines
        r = http.get(f"/v1/jobs/{job_id}/log", params={"sweep": sweep_id})
        assert r.status_code == 413, r.status_code
        assert "over the server's limit of 0.25 MiB (DECODEBENCH_API_MAX_LOG_MB)" in r.json()["error"]
        store.write_bytes(paths.log_key("team-a", sweep_id, job_id), b'{"event": "ok"}\n')
        assert http.get(f"/v1/jobs/{job_id}/log", params={"sweep": sweep_id}).json() == [{"event": "ok"}]


# -- retry plans with submit's checks ------------------------------------------------------------


def test_retry_of_a_rewritten_spec_naming_a_server_file_is_one_line_and_no_oracle(dep, tiny_model, tmp_path):
    with dep.client("alice", timeout=60) as http:
        sweep_id, _ = _submitted(dep, http, tiny_model, "rewritten")
        http.post(f"/v1/sweeps/{sweep_id}/cancel")
        store = FileStore(dep.extra["store"])
        key = paths.spec_key("team-a", sweep_id)
        stored = json.loads(store.read_bytes(key))
        answers = []
        secret = tmp_path / "server-secret.jsonl"
        secret.write_text('{"prompt": "the server\'s own file"}\n')
        for target in (str(secret), str(tmp_path / "missing.jsonl")):
            stored["spec"]["prompts"] = {"path": target, "shard_size": 1}
            store.write_bytes(key, json.dumps(stored).encode())
            r = http.post(f"/v1/sweeps/{sweep_id}/retry", json={})
            answers.append((r.status_code, r.json()["error"].replace(target, "<path>")))
    assert answers[0] == answers[1], answers  # nothing says whether the file exists or what it holds
    status, error = answers[0]
    assert status == 400 and error.startswith(f"stored spec of sweep {sweep_id}: prompts.path: the server reads no")


# -- cheap refusal -------------------------------------------------------------------------------


def test_a_sweep_over_the_whole_quota_is_refused_from_counts_before_it_is_planned(dep, redis_url):
    with dep.client("bob", timeout=120) as http:
        # 3 cells x 600 prompts of 40,000 characters: over the 64 MiB quota from the prompts alone
        r = http.post("/v1/sweeps", json=sweep_body(HUB, "huge", n_prompts=600, chars=40_000))
    assert r.status_code == 413
    assert "the sweep's job payloads hold at least 68.7 MiB; tenant team-b's quota.queued_mb is 64" in r.json()["error"]
    conn = redis.Redis.from_url(redis_url)
    assert not list(conn.scan_iter(match="decodebench:team-b:sweep:*"))


def test_a_body_of_too_many_json_values_is_refused_before_it_is_parsed(serve):
    with serve(DECODEBENCH_API_MAX_REQUEST_ITEMS="10000") as dep, dep.client("alice", timeout=60) as http:
        many = {"spec": {"name": "x", "models": [{}] * 20_000}}
        r = http.post("/v1/sweeps", json=many)
        assert r.status_code == 413 and "(DECODEBENCH_API_MAX_REQUEST_ITEMS)" in r.json()["error"]
        # commas, braces and brackets inside strings are text, not values
        text = {"spec": {"name": "y", "prompts": {"inline": ["a, b, [c], {d}" * 5000]}}}
        assert http.post("/v1/sweeps", json=text).status_code == 400  # refused by the spec's validation


# -- the server's edges --------------------------------------------------------------------------


def test_a_connection_trickling_its_headers_is_closed(serve):
    with serve(DECODEBENCH_API_HEADER_TIMEOUT_S="1") as dep:
        host, port = dep.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            closed = False
            for _ in range(40):  # one header byte every 0.25 s: 10 s of trickle, ten times the timeout
                try:
                    s.sendall(b"X")
                    time.sleep(0.25)
                except OSError:
                    closed = True
                    break
            if not closed:
                s.settimeout(0.5)
                try:
                    closed = s.recv(1) == b""
                except (TimeoutError, OSError) as err:
                    closed = not isinstance(err, TimeoutError)
        assert closed
        # an ordinary request on a new connection is served, and the connection stays usable across requests
        with httpx.Client(base_url=dep.url) as http:
            assert http.get("/healthz").status_code == 200 and http.get("/healthz").status_code == 200


def test_openapi_is_off_by_default_and_behind_a_token_when_on(dep, serve):
    assert httpx.get(f"{dep.url}/openapi.json").status_code == 404
    assert httpx.get(f"{dep.url}/docs").status_code == 404
    with serve("on", DECODEBENCH_API_OPENAPI="1") as on:
        assert httpx.get(f"{on.url}/openapi.json").status_code == 401
        with on.client("alice") as http:
            schema = http.get("/openapi.json").json()
        assert "/v1/sweeps" in schema["paths"]


def test_a_same_size_same_mtime_edit_of_the_tokens_file_revokes_the_token(dep):
    path = dep.dir / "tokens.yaml"
    with dep.client("alice") as http:
        assert http.get("/v1/whoami").status_code == 200
        before = os.stat(path)
        text = path.read_text()
        old = hashlib.sha256(dep.tokens["alice"].encode()).hexdigest()
        new = hashlib.sha256(token("mallory").encode()).hexdigest()
        path.write_text(text.replace(old, new))  # as `cp -p` or `rsync -t` of a same-size file leaves it
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns
        time.sleep(1.2)  # the server checks the file at most once a second
        assert http.get("/v1/whoami").status_code == 401


# -- prompts that are not valid Unicode ----------------------------------------------------------


def test_a_prompt_that_is_not_valid_unicode_is_refused_naming_where(dep, tmp_path, tiny_model):
    from click.testing import CliRunner

    from controller.cli import main as cli

    spec = {
        "name": "surrogates",
        "models": [{"path": tiny_model, "name": "tiny"}],
        "strategies": [{"name": "greedy"}],
        "generation": {"max_new_tokens": 4},
    }
    prompts = tmp_path / "prompts.jsonl"  # JSON writes a lone surrogate as "\ud800"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": "ok", "reference": "x\\udc80"}\n')
    from_file = tmp_path / "file.json"
    from_file.write_text(json.dumps({**spec, "prompts": {"path": str(prompts)}}))
    out = CliRunner().invoke(cli, ["validate", str(from_file)])
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert f"{prompts}:2: `reference` is not valid Unicode: a lone surrogate U+DC80 at character 2" in out.output
    # inline, as a request's JSON carries it
    with dep.client("alice") as http:
        body = json.dumps({"spec": {**spec, "prompts": {"inline": ["fine", "bad \ud800 one"]}}})  # ASCII escapes
        r = http.post("/v1/sweeps", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"] == (  # refused at the door, wherever in the body (tests/hostile/test_server_door.py)
        "request body: spec.prompts.inline[1]: not valid Unicode: a lone surrogate U+D800 at character 5"
    ), r.json()
