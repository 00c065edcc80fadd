"""`decodebench status` on a sweep whose Redis state is partly missing or damaged (issue 14,
item 5): missing fields read as unknown, values that do not decode (a hand's or another
process's write) are named in one warning line each and left out; never a traceback."""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from controller.cli import main as cli
from tests.support.queue import submit
from tests.support.worker import conn_url
from worker import sweepstate
from worker.core import keys
from worker.store import FileStore

# name -> (damage to the sweep's keys `k`, what the one warning line says, or None for no warning)
DAMAGES = {
    "meta-without-name": (lambda c, k: c.hdel(k["meta"], "name"), None),
    "meta-without-queue-and-jobs": (lambda c, k: c.hdel(k["meta"], "queue", "n_jobs"), None),
    "meta-only-cancelled": (lambda c, k: (c.delete(k["meta"]), c.hset(k["meta"], "cancelled", "1")), None),
    "no-counts": (lambda c, k: c.delete(k["counts"]), None),
    "no-cells-for-a-failure": (
        lambda c, k: (
            sweepstate.transition(c, "default", k["id"], "j1", "m::x", "failed", reason="boom"),
            c.delete(k["cells"]),
        ),
        None,
    ),
    "count-without-state": (lambda c, k: c.hset(k["counts"], "nobar", "3"), None),
    "meta-not-utf8": (lambda c, k: c.hset(k["meta"], "name", b"\xff\xfe"), None),
    "failure-not-utf8": (lambda c, k: c.hset(k["failures"], "j9", b"\xff"), None),
    "jobs-not-a-number": (lambda c, k: c.hset(k["meta"], "n_jobs", "abc"), "meta n_jobs: 'abc' is not a finite number"),
    "start-not-a-number": (lambda c, k: c.hset(k["meta"], "started_at", "yesterday"), "started_at: 'yesterday'"),
    "start-infinite": (lambda c, k: c.hset(k["meta"], "started_at", "inf"), "started_at: 'inf' is not a finite"),
    "count-not-a-number": (lambda c, k: c.hset(k["counts"], "m::greedy|queued", "many"), "'many' is not a finite"),
    "recent-not-a-number": (lambda c, k: c.lpush(k["recent"], "x"), "recent: 'x' is not a finite number"),
    "counts-of-another-type": (
        lambda c, k: (c.delete(k["counts"]), c.set(k["counts"], "x")),
        "counts is not of its Redis type; left out",
    ),
}


@pytest.fixture()
def conn(redis_url):
    return redis.Redis.from_url(redis_url)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_status_of_a_damaged_sweep_state_is_shown_without_a_traceback(conn, tmp_path, case, as_json):
    out = submit(conn, FileStore(tmp_path / "runs"))
    k = dict(keys.sweep_keys("default", out.sweep_id), id=out.sweep_id)
    damage, warning = DAMAGES[case]
    damage(conn, k)
    r = CliRunner().invoke(cli, ["status", out.sweep_id, "--redis-url", conn_url(conn), *(["--json"] * as_json)])
    assert r.exit_code == 0 and r.exception is None and "Traceback" not in r.output, (r.exit_code, r.output)
    lines = r.stderr.splitlines()
    if warning is None:
        assert lines == [], r.stderr
    else:
        assert len(lines) == 1 and lines[0].startswith("warning: ") and warning in lines[0], r.stderr
    if as_json:
        shown = json.loads(r.stdout)
        assert shown["sweep_id"] == out.sweep_id and shown["problems"] == [x.removeprefix("warning: ") for x in lines]
    else:
        assert f"sweep {out.sweep_id}" in r.stdout


def test_a_meta_key_of_another_type_is_one_error_line(conn, tmp_path):
    out = submit(conn, FileStore(tmp_path / "runs"))
    meta = keys.sweep("default", out.sweep_id, "meta")
    conn.delete(meta)
    conn.set(meta, "x")
    r = CliRunner().invoke(cli, ["status", out.sweep_id, "--redis-url", conn_url(conn)])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1, r.output
    assert r.stderr.startswith(f"error: no submitted sweep {out.sweep_id!r}") and f"{meta} is not of its" in r.stderr
