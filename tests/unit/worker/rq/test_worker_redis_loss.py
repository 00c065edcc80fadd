"""A worker's RQ record (what `rq info` and `decodebench cluster status` list) through a worker's life.

- A running worker is listed again after Redis restarts without its data: RQ registers a worker once, at its
  birth, so the restarted Redis had no trace of it (its heartbeat wrote a hash holding `last_heartbeat` alone,
  in no worker set) until the worker itself restarted. A real `decodebench-worker` subprocess, idle on one
  queue, and a real redis-server restarted on the same port with nothing kept.
- A killed worker's record expires about a heartbeat TTL after its last heartbeat, not RQ's 8 minutes.
- A worker restarted under a fixed `--name` takes over its dead predecessor's record; a live one's name is
  one line, exit 2.
"""

from __future__ import annotations

import signal
import subprocess

import redis
from rq import Worker

from tests.support.services import free_port, redis_server
from tests.support.worker import wait_for
from tests.support.workerprocs import BIN, wait_for_line, worker_env

QUEUE = "decodebench.default.normal"


def listed(conn: redis.Redis, name: str) -> bool:
    """The worker as `rq info` finds it: in RQ's worker set and its queue's, with its hash whole."""
    workers = {w.name: w for w in Worker.all(connection=conn)}
    by_queue = {w.name for w in Worker.all(connection=conn, queue=_queue(conn))}
    found = workers.get(name)
    return found is not None and name in by_queue and found.birth_date is not None and found.get_state() == "idle"


def _queue(conn: redis.Redis):
    from rq import Queue

    return Queue(QUEUE, connection=conn)


def test_a_running_worker_registers_again_after_redis_lost_its_data(tmp_path, signing_key_file):
    port, name = free_port(), "survivor"
    env = worker_env(f"redis://127.0.0.1:{port}/0", tmp_path, signing_key_file)
    env["DECODEBENCH_REAPER_INTERVAL"] = "1"  # blocking pops of a second: a heartbeat each
    log = tmp_path / "worker.log"
    with redis_server(port=port) as (url, _), log.open("w") as out:
        proc = subprocess.Popen(
            [str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", QUEUE, "--name", name],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_line(log, "Worker", proc)
            wait_for(lambda: listed(redis.Redis.from_url(url), name))
        except BaseException:
            proc.kill()
            raise
    try:
        with redis_server(port=port) as (url, _):  # the same address, nothing kept
            conn = redis.Redis.from_url(url)
            wait_for(lambda: listed(conn, name) or proc.poll() is not None, timeout=120)
            assert proc.poll() is None, log.read_text()[-3000:]
            assert listed(conn, name), log.read_text()[-3000:]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text()[-3000:]
            assert not listed(conn, name)  # and its death is registered as before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_dead_workers_record_lasts_about_its_heartbeat_ttl_not_rqs_eight_minutes(conn):
    """A worker killed outright (SIGKILL, the OOM killer, a crashed process the pod's launcher restarts) leaves
    its RQ record behind until it expires: RQ's default worker TTL kept it 420 + 60 s, listed `busy` by `rq
    info` and counted by `decodebench cluster status` beside its restarted successor, long after the reaper
    had requeued its job (heartbeat TTL + reaper interval)."""
    from tests.support.worker import FAST, make_worker

    worker = make_worker(conn, ["default"])
    worker.register_birth()
    try:
        worker.heartbeat()  # as the idle worker's loop does
        idle = conn.ttl(worker.key)
        assert 0 < idle <= FAST.heartbeat_ttl + 60, idle
    finally:
        worker.register_death()


def test_a_worker_restarted_under_its_name_takes_over_its_dead_predecessors_record(conn, tmp_path, signing_key_file):
    """A worker with a fixed `--name` (docs/one-machine.md, a systemd unit) killed outright and started again:
    RQ refused the name while the dead one's record lasted, a ValueError traceback at every restart. A record
    whose heartbeat is older than the heartbeat TTL is a dead worker's and is taken over; a live worker's name
    is one line, exit 2, and that worker's record is left alone."""
    import datetime

    from rq.utils import utcformat

    from tests.support.worker import conn_url

    env = worker_env(conn_url(conn), tmp_path, signing_key_file)
    argv = [str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", QUEUE, "--name", "gpu0", "--burst"]
    live = make_live_record(conn, "gpu0", datetime.datetime.now(datetime.UTC))
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1].startswith("error: --name gpu0: a worker of that name is running")
    assert "Traceback" not in run.stderr and conn.hgetall(live) != {} and listed_raw(conn, live)
    stale = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=600)  # beyond the 60 s TTL
    conn.hset(live, "last_heartbeat", utcformat(stale))
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "worker.name_taken_over" in run.stderr + run.stdout


def make_live_record(conn: redis.Redis, name: str, beat) -> str:
    """The record a live worker of that name keeps in Redis (RQ's worker hash, in RQ's worker set)."""
    from rq.utils import utcformat

    key = Worker.redis_worker_namespace_prefix + name
    conn.hset(key, mapping={"birth": utcformat(beat), "last_heartbeat": utcformat(beat), "state": "busy"})
    conn.sadd(Worker.redis_workers_keys, key)
    return key


def listed_raw(conn: redis.Redis, key: str) -> bool:
    return bool(conn.sismember(Worker.redis_workers_keys, key))
