"""Queues per engine (docs/engines.md, "Where it runs"), without vLLM: a job goes to its engine's queue,
a worker takes only its engine's queues, and a job that reaches the wrong worker fails for good, never
run by the wrong engine. The mixed sweep through both kinds of workers is in tests/vllm/test_vllm_env.py."""

from __future__ import annotations

import fnmatch

import pytest
from click.testing import CliRunner

from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from tests.support.queue import spec_dict
from tests.support.services import SIGNING_KEY as KEY
from tests.support.worker import run_worker
from worker import sweepstate
from worker.core import keys, paths
from worker.core.errors import UsageError
from worker.sweepstate.reads import queued_jobs

pytestmark = pytest.mark.usefixtures("restore_signals")  # tests/conftest.py: the worker installs its handlers

OWN_Q, VLLM_Q = "decodebench.default.normal", "decodebench.default.normal.vllm"
ENGINES = [{"name": "decodebench"}, {"name": "vllm", "dtype": "float32", "max_model_len": 256}]


def test_queue_names_carry_the_engine_and_the_own_engine_keeps_its_names():
    assert keys.queue_name("team-a", "high") == "decodebench.team-a.high"  # the chart, KEDA and the ACL rely on it
    assert keys.queue_name("team.a", "low", "vllm") == "decodebench.team.a.low.vllm"
    assert keys.parse_queue("decodebench.team.a.low.vllm") == ("team.a", "low", "vllm")
    assert keys.parse_queue("decodebench.vllm.high") == ("vllm", "high", "decodebench")  # a tenant named vllm
    assert keys.parse_queue_name("decodebench.team.a.low.vllm") == ("team.a", "low")
    assert keys.parse_queue("decodebench.high.vllm") is None and keys.parse_queue("decodebench.a.normal.tgi") is None
    assert keys.engine_queues("t", "vllm") == [f"decodebench.t.{p}.vllm" for p in keys.PRIORITIES]
    assert keys.tenant_queues("t") == keys.engine_queues("t") + keys.engine_queues("t", "vllm")
    with pytest.raises(ValueError, match="engine 'tgi'"):
        keys.queue_name("t", "normal", "tgi")
    # the server's and KEDA's Redis users reach the new queues by the patterns they already had
    for queue in keys.tenant_queues("team-a"):
        for key in (keys.rq_queue_key(queue), keys.rq_registry_key("wip", queue)):
            assert any(fnmatch.fnmatchcase(key, pattern) for pattern in keys.keda_acl_keys())
        for key in (keys.rq_queue_key(queue), keys.rq_registry_key("failed", queue)):
            assert any(fnmatch.fnmatchcase(key, pattern) for pattern in keys.server_acl_keys())


def mixed(conn, store, model="/nonexistent/model"):
    spec = parse_spec({**spec_dict(model, prompts=["It is a truth", "She was not"], seeds=[1]), "engines": ENGINES})
    return cq.submit(conn, store, spec, "default", key=KEY)


def test_a_mixed_sweep_puts_each_job_on_its_engines_queue_and_status_cancel_retry_see_both(conn, store):
    out = mixed(conn, store)
    assert len(out.enqueued) == 4 and out.queue == f"{OWN_Q}, {VLLM_Q}"
    cells = {i.decode(): c.decode() for i, c in conn.hgetall(keys.sweep("default", out.sweep_id, "cells")).items()}
    for queue, engine_cells in ((OWN_Q, False), (VLLM_Q, True)):
        ids = [i.decode() for i in conn.lrange(keys.rq_queue_key(queue), 0, -1)]
        assert len(ids) == 2 and all(cells[i].endswith("::vllm") == engine_cells for i in ids), (queue, ids)
    assert store.exists(paths.spec_key("default", out.sweep_id)) and queued_jobs(conn, "default") == 4
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("queued") == 4 and sum(c.endswith("::vllm") for c in s.cells) == 2
    assert sweepstate.cancel_sweep(conn, "default", out.sweep_id).cancelled == 4
    assert queued_jobs(conn, "default") == 0
    for queue in (OWN_Q, VLLM_Q):  # each cancelled job in its own queue's registry
        assert conn.zcard(keys.rq_registry_key("canceled", queue)) == 2, queue
    again = cq.retry(conn, store, "default", out.sweep_id, key=KEY)
    assert len(again.enqueued) == 4 and not conn.zcard(keys.rq_registry_key("canceled", VLLM_Q))
    assert conn.llen(keys.rq_queue_key(OWN_Q)) == conn.llen(keys.rq_queue_key(VLLM_Q)) == 2


def test_the_own_worker_never_takes_a_vllm_job(conn, store, tiny_model):
    out = mixed(conn, store, tiny_model)
    vllm_ids = [i.decode() for i in conn.lrange(keys.rq_queue_key(VLLM_Q), 0, -1)]
    worker = run_worker(conn, ("*",))  # every tenant: still only the own engine's queues
    assert all(keys.queue_engine(q) == "decodebench" for q in worker.queue_names())
    states = dict(zip(vllm_ids, sweepstate.job_states(conn, "default", out.sweep_id, vllm_ids)))
    assert set(states.values()) == {"queued"}, states
    assert [i.decode() for i in conn.lrange(keys.rq_queue_key(VLLM_Q), 0, -1)] == vllm_ids
    assert store.complete_job_ids("default", out.sweep_id) == set(out.enqueued) - set(vllm_ids)


def test_a_job_on_the_wrong_engines_queue_fails_for_good_and_never_runs(conn, store, tiny_model):
    out = mixed(conn, store, tiny_model)
    stray = conn.lmove(keys.rq_queue_key(VLLM_Q), keys.rq_queue_key(OWN_Q), "LEFT", "RIGHT").decode()
    conn.delete(keys.rq_queue_key(VLLM_Q))  # the rest stays out of this test
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    (reason,) = [r for job_id, _cell, r in s.failures if job_id == stray]
    assert reason == f"refused: a job of engine vllm taken by a worker of engine decodebench (queue '{OWN_Q}')"
    assert stray not in store.complete_job_ids("default", out.sweep_id) and s.total("done") == 2


def test_a_worker_takes_only_its_engines_queues(conn, store):
    from worker.rq.queues import resolve_queue_names

    assert resolve_queue_names(conn, ["team-a"], engine="vllm")[0] == keys.engine_queues("team-a", "vllm")
    assert resolve_queue_names(conn, [f"{VLLM_Q},team-b"], engine="vllm")[0][0] == VLLM_Q
    with pytest.raises(UsageError, match=f"--queues '{VLLM_Q}': a queue of engine vllm; this worker runs engine deco"):
        resolve_queue_names(conn, [VLLM_Q])
    with pytest.raises(UsageError, match="a queue of engine decodebench; this worker runs engine vllm"):
        resolve_queue_names(conn, [OWN_Q], engine="vllm")
    mixed(conn, store)
    assert resolve_queue_names(conn, ["*"], engine="vllm") == ([VLLM_Q], True)
    assert resolve_queue_names(conn, ["*"]) == ([OWN_Q], True)


def test_a_worker_refuses_at_start_an_engine_its_environment_cannot_run(monkeypatch):
    import importlib.util

    from worker.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    r = CliRunner().invoke(main, ["--device", "cpu", "--engine", "vllm", "--redis-url", "redis://127.0.0.1:1/0"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith("error: engine vllm: vLLM is not installed in this environment; install it with")
    r = CliRunner().invoke(main, ["--device", "cpu", "--engine", "tgi"])
    assert r.exit_code == 2 and "tgi" in r.output


def test_cluster_status_counts_a_pools_own_engines_queues():
    from controller.ops.cluster import pool_from_deployment, pool_queues

    deployment = {
        "metadata": {
            "name": "db-decodebench-worker-vllm",
            "labels": {"decodebench.io/pool": "vllm"},
            "annotations": {"decodebench.io/queues": "default", "decodebench.io/engine": "vllm"},
        }
    }
    pool = pool_from_deployment(deployment)
    assert pool.engine == "vllm" and pool_queues(pool.tenants, [], pool.engine) == keys.engine_queues("default", "vllm")
    assert pool_queues(("*",), [OWN_Q, VLLM_Q, "other"], "vllm") == [VLLM_Q]
    assert pool_queues(("*",), [OWN_Q, VLLM_Q], "decodebench") == [OWN_Q]
    assert pool_from_deployment({"metadata": {"name": "old"}}).engine == "decodebench"  # charts before engines
