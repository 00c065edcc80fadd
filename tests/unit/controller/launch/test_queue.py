"""Submit, status, cancel, retry and lost-job reaping against a real redis-server (no torch)."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from controller.cli import main as cli
from controller.launch import submit as cq
from controller.sweep.load import load_spec, parse_spec
from controller.sweep.plan import plan
from tests.support.queue import rq_queue, spec_dict, submit
from tests.support.services import SIGNING_KEY as KEY
from worker import sweepstate
from worker.core import keys, rqadapter, signing
from worker.core.contract import JobStatus
from worker.rq.reaper import Timing, reap
from worker.store import FileStore
from worker.sweepstate import transition


def write_spec(tmp_path, **kw) -> str:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(spec_dict(**kw)))
    return str(path)


@pytest.fixture()
def conn(redis_url):
    import redis

    return redis.Redis.from_url(redis_url)


@pytest.fixture()
def store(tmp_path):
    return FileStore(tmp_path / "runs")


def test_keys_and_queue_names():
    assert keys.queue_name("team-a", "high") == "decodebench.team-a.high"
    assert keys.parse_queue_name("decodebench.team.a.low") == ("team.a", "low")
    assert keys.parse_queue_name("default") is None and keys.parse_queue_name("decodebench.x.urgent") is None
    assert keys.sweep("t", "s1", "counts") == "decodebench:t:sweep:s1:counts"
    assert keys.split_count_field("m::top_p(p=0.9)|done") == ("m::top_p(p=0.9)", "done")  # as the Lua writes it
    with pytest.raises(ValueError):
        keys.queue_name("bad tenant")


def test_submit_enqueues_json_jobs_grouped_by_model_and_is_idempotent(conn, store):
    spec = parse_spec(spec_dict(models=[{"path": "/m/a", "name": "a"}, {"path": "/m/b", "name": "b"}]))
    jobs = plan(spec, "default")
    first = cq.submit(conn, store, spec, "default", key=KEY)
    assert first.new and len(first.enqueued) == len(jobs) == 18
    q = rq_queue(conn)
    assert q.count == 18
    queued = q.get_jobs()
    models = [j.args[0]["model"]["name"] for j in queued]
    assert models == sorted(models, key=["a", "b"].index)  # one model's jobs together
    raw = conn.hget(queued[0].key, "data")
    import zlib

    assert json.loads(zlib.decompress(raw))[0] == "worker.rq.task.run_queued_job"  # JSON, never pickle
    assert queued[0].timeout == spec.job_timeout_s and queued[0].retries_left == 3
    assert queued[0].failure_ttl == keys.FAILURE_TTL and queued[0].result_ttl == keys.RESULT_TTL
    assert store.exists(f"default/sweeps/{first.sweep_id}/spec.json")

    again = cq.submit(conn, store, spec, "default", key=KEY)
    assert not again.new and again.enqueued == [] and again.pending == 18
    assert q.count == 18


def test_status_counts_per_cell_and_failure_reasons(conn, store):
    out = submit(conn, store)
    jobs = plan(parse_spec(spec_dict()), "default")
    a, b = jobs[0], jobs[-1]
    transition(conn, "default", out.sweep_id, a.job_id, a.cell, JobStatus.RUNNING)
    transition(conn, "default", out.sweep_id, a.job_id, a.cell, JobStatus.DONE, new_tokens=8, generations=2)
    transition(conn, "default", out.sweep_id, a.job_id, a.cell, JobStatus.DONE, new_tokens=8)  # repeated: counted once
    transition(conn, "default", out.sweep_id, b.job_id, b.cell, JobStatus.RUNNING)
    transition(conn, "default", out.sweep_id, b.job_id, b.cell, JobStatus.FAILED, reason="model 'm': local path gone")
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.n_jobs == 9 and s.total("done") == 1 and s.total("failed") == 1 and s.total("queued") == 7
    assert s.cells[a.cell]["done"] == 1 and s.new_tokens == 8
    assert s.failures == [(b.job_id, b.cell, "model 'm': local path gone")]
    assert not s.complete


def test_cancel_drops_queued_jobs_and_retry_brings_them_back(conn, store):
    out = submit(conn, store)
    submit(conn, store, name="other")  # another sweep's jobs stay queued
    q = rq_queue(conn)
    assert q.count == 18
    result = sweepstate.cancel_sweep(conn, "default", out.sweep_id)
    assert result.cancelled == 9 and q.count == 9
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.cancelled and s.total("cancelled") == 9 and s.complete
    assert (
        cq.submit(conn, store, parse_spec(spec_dict()), "default", key=KEY).enqueued == []
    )  # cancelled: not resumed silently
    again = cq.retry(conn, store, "default", out.sweep_id, key=KEY)
    assert len(again.enqueued) == 9 and q.count == 18
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert not s.cancelled and s.total("queued") == 9


def test_reaper_requeues_a_job_whose_worker_stopped_heartbeating(conn, store):
    from rq.job import JobStatus as RQStatus

    out = submit(conn, store)
    q = rq_queue(conn)
    job = q.get_jobs()[0]
    spec = job.args[0]
    q.remove(job)
    job.set_status(RQStatus.STARTED)
    transition(conn, "default", out.sweep_id, job.id, spec["cell"], JobStatus.RUNNING)
    member = keys.running_member(out.sweep_id, job.id, spec["cell"])
    conn.zadd(keys.running("default"), {member: time.time() - 1})  # its deadline passed
    timing = Timing(heartbeat_ttl=1, reaper_interval=1, max_lost=1)
    assert reap(conn, ["default"], timing) == [job.id]
    assert q.get_job_ids()[0] == job.id  # back at the front
    assert sweepstate.read_status(conn, "default", out.sweep_id).total("running") == 0
    # lost a second time: more than max_lost, so it fails with a readable reason
    q.remove(job)
    job.set_status(RQStatus.STARTED)
    transition(conn, "default", out.sweep_id, job.id, spec["cell"], JobStatus.RUNNING)
    conn.zadd(keys.running("default"), {member: time.time() - 1})
    assert reap(conn, ["default"], timing) == []
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("failed") == 1 and "lost 2 times" in s.failures[0][2]


def test_resubmit_requeues_jobs_whose_rq_records_vanished(conn, store):
    out = submit(conn, store)
    q = rq_queue(conn)
    lost = q.get_jobs()[:2]
    for job in lost:
        job.delete()
    again = submit(conn, store)
    assert sorted(again.enqueued) == sorted(j.id for j in lost) and q.count == 9
    assert sweepstate.read_status(conn, "default", out.sweep_id).total("queued") == 9


def test_cli_submit_status_cancel_retry_logs(conn, redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("DECODEBENCH_REDIS_URL", redis_url)
    runner = CliRunner()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")  # a local model directory
    spec = write_spec(tmp_path, model=str(tmp_path / "m"))
    r = runner.invoke(cli, ["submit", spec, "--priority", "high"])
    assert r.exit_code == 0, r.output
    sweep_id = r.output.split()[1]
    assert "9 jobs on decodebench.default.high" in r.output
    r = runner.invoke(cli, ["submit", spec, "--priority", "high"])
    assert r.exit_code == 0 and "already submitted" in r.output and "0 jobs enqueued now" in r.output

    r = runner.invoke(cli, ["status", sweep_id[:6]])
    assert r.exit_code == 0, r.output
    assert "0/9 jobs done" in r.output and "\n  greedy " in r.output and "9 queued" in r.output
    r = runner.invoke(cli, ["status", sweep_id, "--json"])
    assert json.loads(r.output)["totals"]["queued"] == 9

    jobs = plan(load_spec(spec), "default")  # planned as submit plans it
    j = jobs[0]
    transition(conn, "default", sweep_id, j.job_id, j.cell, JobStatus.RUNNING)
    transition(conn, "default", sweep_id, j.job_id, j.cell, JobStatus.FAILED, reason="model 'm': cannot load")
    r = runner.invoke(cli, ["status", sweep_id])
    assert "failures (1 of 1 shown)" in r.output and "cannot load" in r.output

    r = runner.invoke(cli, ["logs", j.job_id])
    assert r.exit_code == 2 and "has no log" in r.output
    log_key = f"default/sweeps/{sweep_id}/jobs/{j.job_id}/log.jsonl"
    FileStore(tmp_path / "runs").write_jsonl(
        log_key, [{"timestamp": "t0", "level": "info", "event": "job.start", "prompts": 2}]
    )
    r = runner.invoke(cli, ["logs", j.job_id])
    assert r.exit_code == 0 and "job.start prompts=2" in r.output
    r = runner.invoke(cli, ["logs", "nosuchjob"])
    assert r.exit_code == 2 and "--sweep" in r.output

    r = runner.invoke(cli, ["cancel", sweep_id])
    assert r.exit_code == 0 and "8 queued jobs dropped" in r.output
    r = runner.invoke(cli, ["status", sweep_id, "--watch", "--interval", "0.5"])
    assert r.exit_code == 1 and "[CANCELLED]" in r.output and "8 jobs cancelled" in r.output  # not "complete"
    r = runner.invoke(cli, ["retry", sweep_id, "--failed"])
    assert r.exit_code == 0 and "9 failed or cancelled jobs enqueued again" in r.output
    r = runner.invoke(cli, ["status", "nosuchsweep"])
    assert r.exit_code == 2 and "no submitted sweep" in r.output


def test_cli_reports_unreachable_redis_in_one_line(tmp_path):
    from tests.support.services import free_port

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")  # a local model directory
    r = CliRunner().invoke(
        cli,
        [
            "submit",
            write_spec(tmp_path, model=str(tmp_path / "m")),
            "--redis-url",
            f"redis://127.0.0.1:{free_port()}/0",
        ],
    )
    assert r.exit_code == 1 and r.output.startswith("error: Redis at redis://127.0.0.1") and "Traceback" not in r.output


def test_large_sweep_enqueue_and_status(conn, store):
    """2,000 jobs (benchmarks/bench_enqueue.py measures 100,000 and the time `status` takes)."""
    prompts = [f"prompt {i}" for i in range(1000)]
    out = submit(conn, store, prompts=prompts, shard_size=1, seeds=(1,))
    assert len(out.enqueued) == 2000
    assert rq_queue(conn).count == 2000
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("queued") == 2000 and len(s.cells) == 2


def test_reaper_requeues_a_job_taken_by_a_worker_that_died_before_starting_it(conn, store):
    from rq.intermediate_queue import IntermediateQueue

    from worker.rq.worker import ReliableQueue

    submit(conn, store)
    q = rq_queue(conn)
    job, _ = ReliableQueue.dequeue_any([q], None, connection=conn)  # taken, then the worker is killed
    pending = IntermediateQueue(q.key, conn)
    assert pending.get_job_ids() == [job.id] and q.count == 8
    timing = Timing(heartbeat_ttl=5, reaper_interval=1)
    assert reap(conn, ["default"], timing) == []  # first sighting: it may just be starting
    conn.set(pending.get_first_seen_key(job.id), time.time() - 10)
    assert reap(conn, ["default"], timing) == [job.id]
    assert pending.get_job_ids() == [] and q.get_job_ids()[0] == job.id and q.count == 9


def test_sweep_keys_expire_after_their_ttl(conn, store, monkeypatch):
    monkeypatch.setenv("DECODEBENCH_SWEEP_TTL_DAYS", "1")
    out = submit(conn, store)
    jobs = plan(parse_spec(spec_dict()), "default")
    transition(conn, "default", out.sweep_id, jobs[0].job_id, jobs[0].cell, JobStatus.FAILED, reason="x")
    for part, key in keys.sweep_keys("default", out.sweep_id).items():
        if part != "recent":
            assert 0 < conn.ttl(key) <= 86400, part
    for key in keys.sweep_keys("default", out.sweep_id).values():
        conn.delete(key)
    with pytest.raises(Exception, match="no submitted sweep"):
        sweepstate.resolve_sweep(conn, "default", out.sweep_id)
    assert conn.zcard(keys.sweeps("default")) == 1  # reads change nothing
    assert sweepstate.prune_expired_sweeps(conn, "default") == [out.sweep_id]  # the next submit prunes it
    assert conn.zcard(keys.sweeps("default")) == 0


def test_bulk_enqueue_writes_the_jobs_rq_enqueue_many_writes(conn):
    """submit's fast path stores exactly what RQ's own enqueue_many stores (RQ format check)."""
    from rq import Queue
    from rq.job import Job
    from rq.serializers import JSONSerializer

    job = plan(parse_spec(spec_dict()), "default")[0]
    ours_q = rq_queue(conn)
    ref = rqadapter.tenant_job_class("default")  # RQ's own enqueue_many with the same per-tenant job class
    rq_q = Queue("decodebench.reference.normal", connection=conn, serializer=JSONSerializer, job_class=ref)
    policy = cq.retry_policy()
    cq.bulk_enqueue(conn, ours_q, cq.rq_template(ours_q, policy), [job], pipeline=None, key=KEY)
    data, description, meta, timeout, sig = cq.rq_job_fields(job, KEY)
    rq_q.enqueue_many(
        [
            Queue.prepare_data(
                keys.RQ_FUNCTION,
                args=(job.model_dump(mode="json"),),
                job_id="reference",
                timeout=timeout,
                result_ttl=keys.RESULT_TTL,
                failure_ttl=keys.FAILURE_TTL,
                retry=policy,
                description=description,
                meta=json.loads(meta),
            )
        ]
    )
    ours, theirs = conn.hgetall(ref.key_for(job.job_id)), conn.hgetall(ref.key_for("reference"))
    assert ref.key_for(job.job_id) == f"rq:job:default:{job.job_id}" and not conn.exists(Job.key_for(job.job_id))
    assert set(ours) - set(theirs) == {b"decodebench_sig"} and set(theirs) <= set(ours)  # the signature: ours only
    assert signing.verify(KEY, "default", job.job_id, ours[b"data"], ours.pop(b"decodebench_sig"))
    assert ours[b"data"] == data and signing.verify(KEY, "default", job.job_id, data, sig)
    differ = {k for k in ours if ours[k] != theirs[k]}
    assert differ <= {b"created_at", b"enqueued_at", b"data", b"origin"}, differ
    a = ref.fetch(job.job_id, connection=conn, serializer=JSONSerializer)
    b = ref.fetch("reference", connection=conn, serializer=JSONSerializer)
    for attr in (
        "func_name",
        "args",
        "kwargs",
        "description",
        "meta",
        "timeout",
        "retries_left",
        "retry_intervals",
        "result_ttl",
        "failure_ttl",
    ):
        assert getattr(a, attr) == getattr(b, attr), attr
    assert a.get_status() == b.get_status() == "queued" and ours_q.job_ids == [job.job_id]
    assert conn.sismember(Queue.redis_queues_keys, ours_q.key)
