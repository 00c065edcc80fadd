"""Hostile input on the worker's side (issue 14, items 5 and 6), against a real redis-server and
an in-process worker: job payloads in Redis that are not decodebench jobs, and model
directories that are not models. Each fails its job for good with one reason line, in the
sweep's state and in RQ; the worker goes on with the next job."""

from __future__ import annotations

import json
import signal
import zlib

import pytest
from click.testing import CliRunner

from controller.cli import main as cli
from tests.test_queue import rq_queue
from tests.test_worker import conn_url, run_worker, submit
from worker import sweepstate
from worker.core import keys


@pytest.fixture()
def conn(redis_url):
    import redis

    return redis.Redis.from_url(redis_url)


@pytest.fixture()
def store():
    from worker.store import open_store

    return open_store()


@pytest.fixture(autouse=True)
def _restore_signals():
    """The in-process worker installs SIGTERM/SIGINT/SIGUSR1 handlers: put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGALRM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def payload(func: str, *args, kwargs=None) -> bytes:
    return json.dumps([func, None, list(args), kwargs or {}]).encode()


def broken_payloads(spec: dict) -> dict[str, tuple[bytes, str]]:
    """name -> (the job's `data` as RQ stores it, uncompressed; a part of the expected reason)."""
    f = keys.RQ_FUNCTION
    without_model = {k: v for k, v in spec.items() if k != "model"}
    return {
        "malformed_json": (b'["worker.rq.task.run_queued_job", null, [{"tenant": ', "not readable JSON"),
        "not_utf8": (b"\xff\xfe\x00garbage", "not readable JSON"),
        "json_null": (b"null", "not readable JSON"),
        "missing_field": (payload(f, without_model), "invalid job: model: Field required"),
        "wrong_types": (payload(f, dict(spec, seed="abc")), "invalid job: seed:"),
        "model_not_an_object": (payload(f, dict(spec, model="m")), "invalid job: model:"),
        "other_function": (payload("os.system", "echo hi"), "calls 'os.system', not worker.rq.task.run_queued_job"),
        "args_not_a_dict": (payload(f, "a string"), "arguments are not one JobSpec object"),
        "two_args": (payload(f, spec, spec), "arguments are not one JobSpec object"),
        "no_ids": (payload(f, {"hello": 1}), "not a decodebench job"),
        "key_with_newlines": (payload(f, dict(spec, **{"x\ny" * 50: 1})), "invalid job: 'x\\nyx\\ny"),
        "other_tenant": (payload(f, dict(spec, tenant="team-x")), "a job of tenant 'team-x' on the queue of tenant"),
    }


def test_broken_job_payloads_fail_their_jobs_with_a_reason_and_the_worker_goes_on(conn, store, tiny_model):
    from rq.registry import FailedJobRegistry

    prompts = [f"It was the {n}th of the month" for n in range(8)]
    out = submit(conn, store, tiny_model, shard_size=1, prompts=prompts)  # 8 x (greedy + top_k x 2 seeds)
    n = len(out.enqueued)
    first = json.loads(zlib.decompress(conn.hget(keys.rq_job_key("default", out.enqueued[0]), "data")))
    broken = broken_payloads(first[2][0])
    planted = dict(zip(out.enqueued[::2], broken.items()))  # every other job, the first one included
    assert n == 24 and len(planted) == len(broken)
    for job_id, (_, (data, _)) in planted.items():
        conn.hset(keys.rq_job_key("default", job_id), "data", zlib.compress(data))
    conn.hset(keys.rq_job_key("default", out.enqueued[0]), "meta", b"\x00not json either")

    worker = run_worker(conn)

    s = sweepstate.read_status(conn, "default", out.sweep_id, max_failures=50)
    assert s.complete and s.total("done") == n - len(broken) and s.total("failed") == len(broken)
    assert store.complete_job_ids("default", out.sweep_id) == set(out.enqueued) - set(planted)
    reasons = {job_id: reason for job_id, _cell, reason in s.failures}
    assert set(reasons) == set(planted)
    for job_id, (name, (_, expected)) in planted.items():
        assert expected in reasons[job_id] and "\n" not in reasons[job_id] and len(reasons[job_id]) < 300, name
        failed = rq_queue(conn).fetch_job(job_id)
        assert failed.retries_left == 0 and not failed.number_of_retries, name  # tried once
        assert failed.meta["reason"] == reasons[job_id], name
    assert FailedJobRegistry(keys.queue_name("default"), connection=conn).count == len(broken)
    assert conn.zcard(keys.running("default")) == 0 and not worker._refused
    r = CliRunner().invoke(cli, ["status", out.sweep_id, "--redis-url", conn_url(conn)])
    assert r.exit_code == 0 and "invalid job: model: Field required" in r.output and "Traceback" not in r.output


def test_a_forged_job_no_sweep_knows_is_failed_in_rq_and_the_worker_goes_on(conn, store, tiny_model):
    from rq.registry import FailedJobRegistry

    out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A"])  # 2 jobs
    forged = keys.rq_job_key("default", "forged")
    conn.hset(forged, mapping={"data": zlib.compress(b"{oops"), "origin": keys.queue_name("default")})
    conn.lpush(keys.rq_queue_key(keys.queue_name("default")), "forged")
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("done") == 2 and s.n_failures == 0
    assert "forged" in FailedJobRegistry(keys.queue_name("default"), connection=conn).get_job_ids()
    assert "not readable JSON" in rq_queue(conn).fetch_job("forged").meta["reason"]
