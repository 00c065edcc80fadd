"""status flags running jobs whose worker stopped beating (issue 28, item 3): before the reaper
requeues them (a heartbeat TTL later) `status` says they may have lost their worker."""

from __future__ import annotations

import time

from controller.cli.distributed import render_status
from worker import sweepstate
from worker.core import keys


def test_a_running_job_without_recent_heartbeats_is_flagged(redis_url, monkeypatch):
    import redis

    monkeypatch.setenv("DECODEBENCH_HEARTBEAT_TTL", "60")
    conn = redis.Redis.from_url(redis_url)
    sweepstate.heartbeat_job(conn, "default", "sweep0000000000a", "job-live", "m::greedy", 60, create=True)
    sweepstate.heartbeat_job(conn, "default", "sweep0000000000a", "job-silent", "m::greedy", 60, create=True)
    sweepstate.heartbeat_job(conn, "default", "sweep0000000000b", "job-other", "m::greedy", 60, create=True)
    # job-silent's worker last beat 40 s ago (its deadline is 20 s away); the other sweep's too
    for job, sweep in (("job-silent", "sweep0000000000a"), ("job-other", "sweep0000000000b")):
        conn.zadd(keys.running("default"), {keys.running_member(sweep, job, "m::greedy"): time.time() + 20})
    assert sweepstate.stale_runs(conn, "default", "sweep0000000000a") == 1


def test_status_names_the_stale_jobs():
    s = {
        "sweep_id": "sweep0000000000a", "name": "demo", "tenant": "default", "queue": "decodebench.default.normal",
        "cancelled": False, "jobs": 3, "complete": False, "cells": {"m::greedy": {"running": 3}},
        "totals": {"queued": 0, "running": 3, "done": 0, "failed": 0, "cancelled": 0},
        "jobs_per_s": None, "tokens_per_s": None, "eta_s": None, "lost": 0, "stale": 1,
        "n_failures": 0, "failures": [],
    }  # fmt: skip
    text = render_status(s)
    assert "1 running job without a recent heartbeat: the worker may be gone" in text
    assert "heartbeat" not in render_status({**s, "stale": 0})


FAKE = """
from controller.cli.distributed import watch_live
class Fake:
    n = 0
    def status(self, sweep):
        self.n += 1
        done = self.n >= 3
        totals = {"queued": 0, "running": 0 if done else 3, "done": 3 if done else 0, "failed": 0, "cancelled": 0}
        return {"sweep_id": "s1", "name": "demo", "tenant": "default", "queue": "q", "cancelled": False, "jobs": 3,
                "complete": done, "cells": {"m::greedy": totals}, "totals": totals, "jobs_per_s": None,
                "tokens_per_s": None, "eta_s": None, "lost": 0, "stale": 0, "n_failures": 0, "failures": [],
                "problems": []}
watch_live(Fake(), "s1", 0.1)
"""


def test_watch_redraws_one_block_in_place_at_a_terminal():
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE], stdout=slave, stderr=slave, env={**os.environ, "COLUMNS": "100"}
    )
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(60) == 0
    text = out.decode()
    assert "\x1b[1A" in text and "\x1b[2K" in text  # cursor up, erase line: the block is redrawn
    assert "3/3 jobs done" in text


def test_staleness_is_judged_by_each_job_workers_own_heartbeat_ttl(redis_url, monkeypatch):
    """A worker's heartbeat TTL is its own (`decodebench-worker --heartbeat-ttl`, a pool's extraEnv): status,
    which reads its own DECODEBENCH_HEARTBEAT_TTL, flagged every job of a worker with a shorter TTL the moment
    it started, and a silent worker with a longer one only long after it had missed its beats."""
    import redis

    monkeypatch.setenv("DECODEBENCH_HEARTBEAT_TTL", "60")  # the reader's (the server's) own
    conn = redis.Redis.from_url(redis_url)
    sweep = "sweep0000000000a"
    sweepstate.heartbeat_job(conn, "default", sweep, "job-quick", "m::greedy", 12, create=True)  # beat just now
    sweepstate.heartbeat_job(conn, "default", sweep, "job-patient", "m::greedy", 300, create=True)
    assert sweepstate.stale_runs(conn, "default", sweep) == 0
    # job-patient's worker (TTL 300) last beat 200 s ago: its deadline is 100 s away, and it missed 4 beats
    conn.zadd(keys.running("default"), {keys.running_member(sweep, "job-patient", "m::greedy"): time.time() + 100})
    assert sweepstate.stale_runs(conn, "default", sweep) == 1
    sweepstate.forget_job(conn, "default", sweep, "job-patient", "m::greedy")
    sweepstate.forget_job(conn, "default", sweep, "job-quick", "m::greedy")
    assert sweepstate.stale_runs(conn, "default", sweep) == 0 and not conn.exists(keys.running_ttls("default"))
