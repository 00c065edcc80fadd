"""What a worker obeys (issue 23): a signed payload, its tenant's policy and the per-job limits;
nothing else a client could have written into Redis. Each test is an attack that worked against
the worker before (real redis-server, real workers: in-process, or a subprocess where a hang must
be shown absent). The shared helpers are test_worker's and test_hostile_worker's."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib

import pytest
import redis
from click.testing import CliRunner

from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from tests.support.queue import spec_dict
from tests.support.services import SIGNING_KEY as KEY
from tests.support.worker import make_worker, plant, reason, run_worker, submit, wait_for
from tests.support.workerprocs import BIN, env_for
from worker import sweepstate
from worker.core import keys, signing
from worker.core.errors import UsageError
from worker.core.tenants import parse_tenants

pytestmark = pytest.mark.usefixtures("restore_signals")  # tests/conftest.py: the worker installs its handlers

FORGED_CALLBACK = "tests.support.forged.mark"


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setenv("DECODEBENCH_RETRY_INTERVALS", "1,1,1")


def submit_as(conn, store, tenant: str, model: str, **kw):
    return cq.submit(conn, store, parse_spec(spec_dict(model, **kw)), tenant, key=KEY)


def resign(conn, job_id: str, change, tenant: str = "default") -> None:
    """Change a queued job's payload and sign it again: what a server should never have signed."""
    call = json.loads(zlib.decompress(conn.hget(keys.rq_job_key(tenant, job_id), "data")))
    change(call[2][0])
    plant(conn, job_id, json.dumps(call).encode(), tenant)


def push(conn, job_id: str, tenant: str = "default") -> None:
    conn.rpush(keys.rq_queue_key(keys.queue_name(tenant)), job_id)


def test_forged_callbacks_are_never_imported_nor_called(conn, store, tiny_model, tmp_path, monkeypatch):
    marker = tmp_path / "called"
    monkeypatch.setenv("FORGED_MARKER", str(marker))
    out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A"])
    forged = {f"{kind}_callback_name": FORGED_CALLBACK for kind in ("success", "failure", "stopped")}
    for job_id in out.enqueued:  # jobs that run to success
        conn.hset(keys.rq_job_key("default", job_id), mapping=forged)
    plant(conn, "unsigned", b"[]", key=None, **forged)  # and a job the worker refuses
    push(conn, "unsigned")
    plant(conn, "abandoned", b"[]", status="started", **forged)  # and one RQ's registry cleanup finds
    conn.zadd(keys.rq_registry_key("wip", keys.queue_name("default")), {"abandoned:e1": 1})
    run_worker(conn)
    assert sweepstate.read_status(conn, "default", out.sweep_id).total("done") == 2
    assert not marker.exists() and "tests.support.forged" not in sys.modules
    assert "not signed" in reason(conn, "unsigned")
    assert conn.hget(keys.rq_job_key("default", "abandoned"), "status") == b"failed"  # cleaned up, not called


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self) -> None:
        type(self).seen.append(self.path)
        self.send_response(200)
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *args) -> None:
        pass


def hooks(url: str, timeout: int = 2) -> str:
    return json.dumps(
        [
            {"url": url, "job_status": s, "method": "POST", "headers": {"X-Forged": "1"}, "timeout": timeout}
            for s in ("finished", "failed")
        ]
    )


def test_webhooks_in_a_job_hash_are_never_sent(conn, store, tiny_model):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A"])
        for job_id in out.enqueued:
            conn.hset(keys.rq_job_key("default", job_id), "webhooks", hooks(url))
        plant(conn, "unsigned", b"[]", key=None, webhooks=hooks(url))
        push(conn, "unsigned")
        run_worker(conn)
    finally:
        server.shutdown()
    assert sweepstate.read_status(conn, "default", out.sweep_id).total("done") == 2
    assert "not signed" in reason(conn, "unsigned") and _Recorder.seen == []


def test_a_webhook_to_a_silent_socket_cannot_hold_a_worker_past_sigterm(
    conn, store, tiny_model, redis_url, tmp_path, signing_key_file
):
    """A worker process (not burst): its jobs carry webhooks to a socket that accepts and never
    answers, with an hour's timeout. The jobs run, nothing connects, SIGTERM stops the worker."""
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.extend(iter(lambda: silent.accept()[0], None)), daemon=True).start()
    out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A"])
    url = "http://{}:{}/".format(*silent.getsockname())
    for job_id in out.enqueued:
        conn.hset(keys.rq_job_key("default", job_id), "webhooks", hooks(url, timeout=3600))
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", "default"],
        env=env_for(redis_url, os.environ["DECODEBENCH_STORE"], signing_key_file),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: sweepstate.read_status(conn, "default", out.sweep_id).total("done") == 2, timeout=180)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)  # a hung webhook would hold it for the hour of its timeout
    finally:
        if proc.poll() is None:
            proc.kill()
        silent.close()
    assert code == 0, (tmp_path / "worker.log").read_text()[-2000:]
    assert accepted == []


def test_a_spoofed_origin_writes_no_other_tenants_registries(conn, store, tiny_model):
    a = submit_as(conn, store, "team-a", tiny_model, seeds=(1,), prompts=["A"])
    theirs = keys.queue_name("team-b")
    for job_id in a.enqueued:
        conn.hset(keys.rq_job_key("team-a", job_id), "origin", theirs)
    resign(conn, a.enqueued[1], lambda s: s["strategy"].update(name="contrastive", params={"k": 10**6}), "team-a")
    run_worker(conn, ["team-a", "team-b"])
    for kind in keys.RQ_REGISTRIES:
        assert conn.zcard(keys.rq_registry_key(kind, theirs)) == 0, kind
    ours = keys.queue_name("team-a")
    assert conn.zrange(keys.rq_registry_key("finished", ours), 0, -1) == [a.enqueued[0].encode()]
    assert conn.zrange(keys.rq_registry_key("failed", ours), 0, -1) == [a.enqueued[1].encode()]


def test_a_forged_hash_deletes_no_other_tenants_queued_job(conn, store, tiny_model):
    b = submit_as(conn, store, "team-b", tiny_model, seeds=(1,), prompts=["A"])
    victim = b.enqueued[0]
    forged = {
        "origin": keys.queue_name("team-b"),
        "failure_callback_name": "rq.job.Job.delete",
        "dependency_ids": json.dumps([victim]),
        "dependency_id": victim,
    }
    plant(conn, victim, b"{oops", "team-a", key=None, **forged)  # the victim's id, in team-a's own keys
    conn.sadd(keys.rq_job_key("team-a", victim) + ":dependents", victim)
    push(conn, victim, "team-a")
    run_worker(conn, ["team-a"])
    assert "not signed" in reason(conn, victim, "team-a")
    assert conn.lrange(keys.rq_queue_key(keys.queue_name("team-b")), 0, -1) == [j.encode() for j in b.enqueued]
    run_worker(conn, ["team-b"])
    assert sweepstate.read_status(conn, "team-b", b.sweep_id).total("done") == 2


def test_a_zlib_bomb_is_refused_as_it_inflates(conn, store, tiny_model, monkeypatch):
    monkeypatch.setenv("DECODEBENCH_MAX_JOB_MB", "1")
    out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A"])
    plant(conn, out.enqueued[0], b"[" + b" " * (64 * 2**20) + b"]")  # 64 MiB in ~64 KiB, signed
    run_worker(conn)
    assert "inflates past 1,048,576 bytes" in reason(conn, out.enqueued[0])
    assert sweepstate.read_status(conn, "default", out.sweep_id).total("done") == 1


def test_inflate_never_holds_more_than_its_cap():
    import tracemalloc

    bomb = zlib.compress(b"\0" * (256 * 2**20), 9)  # 256 MiB from ~256 KiB
    tracemalloc.start()
    try:
        with pytest.raises(Exception, match="inflates past 1,048,576 bytes"):
            signing.inflate(bomb, 2**20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak
    assert signing.inflate(zlib.compress(b"x" * 2**20), 2**20) == b"x" * 2**20  # exactly the cap: fine


def test_unsigned_missigned_and_borrowed_signatures_are_refused_before_decoding(conn, store, tiny_model):
    out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A", "B", "C"], shard_size=1)
    j = out.enqueued
    key = lambda job_id: keys.rq_job_key("default", job_id)
    garbage = b"\x00 not zlib"  # "not zlib data" if it were ever decoded
    conn.hset(key(j[0]), "data", garbage)
    conn.hdel(key(j[0]), signing.SIG_FIELD)
    conn.hset(
        key(j[1]), mapping={"data": garbage, signing.SIG_FIELD: signing.sign(b"k" * 32, "default", j[1], garbage)}
    )
    conn.hset(key(j[2]), mapping={f: conn.hget(key(j[3]), f) for f in ("data", signing.SIG_FIELD)})  # j3's, whole
    data = conn.hget(key(j[4]), "data")
    conn.hset(key(j[4]), signing.SIG_FIELD, signing.sign(KEY, "team-b", j[4], data))  # another tenant's
    run_worker(conn)
    for job_id in j[:3] + j[4:5]:
        why = reason(conn, job_id)
        assert ("not signed" in why or "does not verify" in why) and "zlib" not in why, why
    assert store.complete_job_ids("default", out.sweep_id) == {j[3], j[5]}


def test_forbidden_models_in_every_role_are_refused(conn, store, tiny_model, small_model):
    tenants = parse_tenants({"tenants": [{"name": "team-a", "models": [tiny_model, f"{small_model}@v1"]}]})
    a = submit_as(conn, store, "team-a", tiny_model, seeds=(1,), prompts=list("ABCDE"), shard_size=1)
    assisted = {"name": "assisted", "params": {"assistant": small_model, "num_assistant_tokens": 5}}
    changes = {
        "scorer ": lambda s: s.update(scorer={"path": small_model}),
        "featurizer ": lambda s: s.update(featurizer={"path": small_model}),
        "assistant ": lambda s: s.update(strategy=assisted),
        "@v2' is not among": lambda s: s.update(scorer={"path": small_model, "revision": "v2"}),
        "trust_remote_code": lambda s: s["model"].update(trust_remote_code=True),
    }
    for job_id, change in zip(a.enqueued, changes.values()):
        resign(conn, job_id, change, "team-a")
    make_worker(conn, ["team-a"], tenants=tenants).work(burst=True)
    for job_id, expected in zip(a.enqueued, changes):
        why = reason(conn, job_id, "team-a")
        assert why.startswith("refused: ") and expected in why and "\n" not in why, why
    assert sweepstate.read_status(conn, "team-a", a.sweep_id).total("done") == 5


def test_cost_and_context_over_the_limits_fail_for_good(conn, store, tiny_model):
    out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A", "B"], shard_size=1)
    big = 2**31 - 1
    changes = {
        "beam num_beams=2147483647 is over the limit of 64": lambda s: s.update(
            strategy={"name": "beam", "params": {"num_beams": big, "length_penalty": 1.0, "early_stopping": False}}
        ),
        "contrastive k=2147483647 is over the limit of 64": lambda s: s.update(
            strategy={"name": "contrastive", "params": {"k": big, "alpha": 0.6}}
        ),
        "takes 256 positions": lambda s: s["generation"].update(max_new_tokens=300),
    }
    for job_id, change in zip(out.enqueued, changes.values()):
        resign(conn, job_id, change)
    run_worker(conn)
    for job_id, expected in zip(out.enqueued, changes):
        assert expected in reason(conn, job_id)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("failed") == 3 and s.total("done") == 1


def test_a_worker_with_a_tenants_file_serves_declared_tenants_only(conn, store, tiny_model):
    tenants = parse_tenants({"tenants": [{"name": "team-a"}]})
    x = submit_as(conn, store, "team-x", tiny_model, seeds=(1,), prompts=["A"])
    a = submit_as(conn, store, "team-a", tiny_model, seeds=(1,), prompts=["A"])
    conn.sadd(keys.RQ_QUEUES, *[keys.rq_queue_key(f"decodebench.ghost{i}.normal") for i in range(2000)])
    worker = run_worker(conn, ["*"], tenants=tenants)
    assert sorted(worker.queue_names()) == sorted(keys.engine_queues("team-a")) and worker.tenants == ["team-a"]
    assert sweepstate.read_status(conn, "team-a", a.sweep_id).total("done") == 2
    assert conn.llen(keys.rq_queue_key(keys.queue_name("team-x"))) == len(x.enqueued) == 2  # never taken
    with pytest.raises(UsageError, match="tenant 'team-x' is not declared in the tenants file"):
        make_worker(conn, ["team-a", "team-x"], tenants=tenants)


def test_a_worker_without_a_signing_key_does_not_start(conn, monkeypatch, redis_url):
    from worker.cli import main as worker_main

    monkeypatch.delenv("DECODEBENCH_SIGNING_KEY_FILE")
    with pytest.raises(UsageError, match="^DECODEBENCH_SIGNING_KEY_FILE is not set: workers run only jobs signed"):
        make_worker(conn)
    r = CliRunner().invoke(worker_main, ["--device", "cpu", "--redis-url", redis_url, "--burst"])
    assert r.exit_code == 2 and "DECODEBENCH_SIGNING_KEY_FILE is not set" in r.output, r.output


def test_validate_applies_the_per_job_limits(tmp_path, tiny_model):
    from controller.cli import main as cli

    spec = spec_dict(tiny_model, seeds=(1,))
    spec["strategies"] = [{"name": "beam", "params": {"num_beams": 1000}}]
    (tmp_path / "sweep.json").write_text(json.dumps(spec))
    r = CliRunner().invoke(cli, ["validate", str(tmp_path / "sweep.json")])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        "error: refused: beam num_beams=1000 is over the limit of 64 (DECODEBENCH_MAX_NUM_BEAMS)"
    ]


def test_a_restored_job_keeps_only_what_decodebench_needs():
    from rq.serializers import JSONSerializer

    from worker.core.rqadapter.job import sealed_job_class

    job = sealed_job_class("team-a")("x", connection=redis.Redis(), serializer=JSONSerializer)
    job.restore(
        {
            b"data": b"stored as is",
            b"meta": b"[" + b"1," * 100_000 + b"1]",  # not a dict, and too large to parse
            b"origin": keys.queue_name("team-b").encode(),
            b"failure_callback_name": b"builtins.print",
            b"webhooks": json.dumps([{"url": "http://example.invalid/", "job_status": "failed"}]).encode(),
            b"dependency_ids": b'["victim"]',
            b"result_ttl": b"-1",
            b"ttl": b"1",
            b"retries_left": b"999",
            b"retry_intervals": b'[0, -5, 999999999, "x"]',
            b"timeout": b"-3",
            b"status": b"bogus",
        }
    )
    assert job.origin == keys.queue_name("team-a") and "unserialized" in job.meta
    assert job.failure_callback is None and job.webhooks == [] and job._dependency_ids == [] and job.ttl is None
    assert (job.result_ttl, job.failure_ttl) == (keys.RESULT_TTL, keys.FAILURE_TTL)
    assert job.retries_left == 10 and job.retry_intervals == [0, 0, 86400] and job.timeout == 1
    assert job.get_status(refresh=False) == "created"
    saved = job.to_dict()
    assert saved["data"] == b"stored as is" and saved["failure_callback_name"] == "" and "webhooks" not in saved
