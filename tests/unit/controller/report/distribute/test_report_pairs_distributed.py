"""The paired comparisons on the cluster (issue 25, item 7): after the cells, one signed job per
(cell, baseline) pair missing from the cache, planned by the signer from the store, run by
`decodebench report-worker` processes against a real redis-server; the controller reduces."""

from __future__ import annotations

import pandas as pd
import pytest

from controller.report.api import build
from controller.report.compute import pairs
from controller.report.compute.aggregate import summarize
from controller.report.compute.cache import ReportCache
from controller.report.compute.pairs import PairJob
from controller.report.distribute.mapworker import report_worker
from controller.report.distribute.remote import ReportWorkers
from tests.support.report import CELLS, make_sweep, write_with_hashes
from tests.support.reportworkers import operator, plant, report_workers
from tests.support.services import SIGNING_KEY as KEY
from worker.core import keys, paths, rqadapter
from worker.store import FileStore, open_store

pytestmark = pytest.mark.usefixtures("restore_signals")  # tests/conftest.py: the in-process report worker's handlers


def pair_jobs(conn, tenant: str = "default") -> int:
    return len(conn.keys(keys.rq_job_prefix(tenant) + "pair-*"))


def cell_jobs(conn, tenant: str = "default") -> int:
    return len(conn.keys(keys.rq_job_prefix(tenant) + "cell-*"))


def pair_payload(tenant, sweep_id, cell, base, names, n_boot, seed, baseline) -> dict:
    """A pair job's payload, as the signer writes it."""
    cache = ReportCache(None, tenant, sweep_id)
    return PairJob(tuple(names), n_boot, seed, baseline, cache, (cell, base)).payload()


def cache_names(store, tenant: str, sweep_id: str) -> set[str]:
    return {k.rsplit("/", 1)[1] for k in store.list(paths.report_key(tenant, sweep_id, "cache/"))}


def counting(monkeypatch) -> list[str]:
    """Every paired comparison computed in this process (the controller), by cell."""
    calls: list[str] = []
    real = pairs.compare_pair
    monkeypatch.setattr(pairs, "compare_pair", lambda a, *args, **kw: calls.append(a.cell) or real(a, *args, **kw))
    return calls


def waits(monkeypatch) -> list[tuple[str, int]]:
    """(what, how many are in) each time the controller's wait for the report workers saw more come in."""
    arrived: list[tuple[str, int]] = []
    real = ReportCache.arrivals

    def arrivals(self, names, *, what, **kw):
        for n in real(self, names, what=what, **kw):
            arrived.append((what, n))
            yield n

    monkeypatch.setattr(ReportCache, "arrivals", arrivals)
    return arrived


def test_the_report_workers_compute_the_pairs_and_the_report_equals_the_local_one(redis_url, tmp_path, monkeypatch):
    import redis

    conn = redis.Redis.from_url(redis_url)
    url = str(tmp_path / "s")
    store = open_store(url)
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS)
    write_with_hashes(store, data)
    local = summarize(data, n_boot=100)  # one process, every pair computed here
    here = counting(monkeypatch)
    op = operator(redis_url, url)
    with report_workers(2, redis_url, url):
        dispatch = ReportWorkers(op, stall_s=90)
        ticks, arrived = [], waits(monkeypatch)
        tick = lambda *tick: ticks.append(tick)
        _, distributed = build(store, data.tenant, data.sweep_id, n_boot=100, remote=dispatch, progress=tick)
        assert cell_jobs(conn) == 4 and pair_jobs(conn) == 2
        # the progress moves while the controller waits, as the workers' outputs come in, and never backwards
        assert {w for w, _ in arrived} == {"cells", "pairs"}
        assert all((w, n, {"cells": 4, "pairs": 2}[w]) in ticks for w, n in arrived), (arrived, ticks)
        for what in ("cells", "pairs"):
            counts = [done for w, done, _ in ticks if w == what]
            assert counts == sorted(counts) and counts[-1] == {"cells": 4, "pairs": 2}[what]
        assert here == [] and pair_jobs(conn) == 2  # m's top_p and top_k against m's greedy, by the workers
        pd.testing.assert_frame_equal(local, distributed, check_exact=True)

        # another baseline is another set of pairs (the baseline is in the pair's key and payload)
        _, other = build(store, data.tenant, data.sweep_id, n_boot=100, baseline="top_k", remote=dispatch)
        assert cell_jobs(conn) == 4 and here == [] and pair_jobs(conn) == 4
    pd.testing.assert_frame_equal(other, summarize(data, n_boot=100, baseline="top_k"), check_exact=True)
    assert len([n for n in cache_names(store, data.tenant, data.sweep_id) if n.startswith("pair-")]) == 4


def test_pairs_no_report_worker_delivers_are_computed_by_the_controller(redis_url, tmp_path, monkeypatch):
    import redis

    conn = redis.Redis.from_url(redis_url)
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS)
    write_with_hashes(store, data)
    here = counting(monkeypatch)
    op = operator(redis_url, str(tmp_path / "s"))
    dispatch = ReportWorkers(op, stall_s=0.5, poll_s=0.1)
    _, summary = build(store, data.tenant, data.sweep_id, n_boot=50, remote=dispatch)  # no worker runs
    assert pair_jobs(conn) == 2
    assert len(here) == 2  # asked, not delivered, computed here
    pd.testing.assert_frame_equal(summary, summarize(data, n_boot=50), check_exact=True)


# -- hostile ---------------------------------------------------------------------------------------


def cached_sweep(store, tenant: str, sweep_id: str):
    """A sweep whose cells are in the report cache (its pairs not): the payload of its first pair."""
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:3], tenant=tenant, sweep_id=sweep_id)
    write_with_hashes(store, data)
    build(store, tenant, sweep_id, n_boot=50)
    for name in cache_names(store, tenant, sweep_id):
        if name.startswith("pair-"):
            store.delete(paths.report_key(tenant, sweep_id, f"cache/{name}"))
    from controller.report.distribute.signer import plan_pairs

    _, jobs = plan_pairs(store, tenant, sweep_id, n_boot=50, seed=0, n_boot_corpus=100, baseline=None)
    docs = [job.payload() for job in jobs]
    assert len(docs) == 2
    return data, docs


def test_forged_cross_tenant_and_misaddressed_pair_jobs_are_refused_and_write_nothing(redis_url, tmp_path):
    import redis

    conn = redis.Redis.from_url(redis_url)
    store = FileStore(tmp_path / "s")
    a, (mine, other) = cached_sweep(store, "team-a", "sweepaaaaaaaaaaa")
    b, (theirs, _) = cached_sweep(store, "team-b", "sweepbbbbbbbbbbb")
    call = lambda doc: [keys.REPORT_FUNCTION, None, [doc], {}]
    as_a = theirs | {"tenant": "team-a"}
    escape = f"../../../team-b/sweeps/{b.sweep_id}/report/cache/pair-{theirs['pair']}"
    not_its_own = "the pair job's digest is not its cells' and settings'"
    planted = {
        "unsigned": (call(as_a), None, "not signed"),
        "forged": (call(as_a), b"another-key-of-at-least-32-bytes-xxxx", "does not verify"),
        "cross-tenant": (call(theirs), KEY, "a report job of tenant 'team-b' on the report queue of tenant 'team-a'"),
        "escaping-key": (call(mine | {"pair": escape}), KEY, "the pair job's pair is not a cache digest"),
        "other-sweep": (call(as_a), KEY, not_its_own),
        # team-a's own cells, but written over another pair's entry: the digest must be its own
        "overwrite": (call(mine | {"pair": other["pair"]}), KEY, not_its_own),
        "other-kind": (call(mine | {"kind": "shell"}), KEY, "kind 'shell' is not 'pair'"),
        "extra-field": (call(mine | {"store": "s3://elsewhere"}), KEY, "the pair job's fields are not"),
        "bad-metric": (call(mine | {"names": ["os"]}), KEY, "unknown metric 'os'"),
        "huge-n-boot": (call(mine | {"n_boot": 10**9}), KEY, "the pair job's n_boot is out of bounds"),
    }
    for job_id, (c, key, _) in planted.items():
        plant(conn, "team-a", job_id, c, key)
    before = {t: cache_names(store, t, s) for t, s in (("team-a", a.sweep_id), ("team-b", b.sweep_id))}
    report_worker(["team-a"], connection=conn, store=store, key=KEY, max_job_bytes=2**20, beat_s=0.2).work(burst=True)
    for job_id, (_, _, reason) in planted.items():
        job = rqadapter.fetch(conn, rqadapter.tenant_job_class("team-a"), job_id)
        assert job.get_status() == "failed" and reason in job.meta["reason"], (job_id, job.meta)
    after = {t: cache_names(store, t, s) for t, s in (("team-a", a.sweep_id), ("team-b", b.sweep_id))}
    assert after == before  # no pair entry, no failure mark, in either tenant's cache

    # the signer plans a tenant's pairs from its own prefix of the store: team-a cannot name team-b's sweep
    from controller.server import service
    from controller.server.errors import NotFound
    from controller.server.tokens import Identity

    ctx = service.Context(conn=conn, store=store, signing_key=KEY, tenants=None, limits=None)
    with pytest.raises(NotFound):
        service.report_pairs(ctx, Identity("tok-a", "team-a", False), b.sweep_id, service.ReportPairsRequest())
    assert pair_jobs(conn, "team-b") == 0

    # team-a's own pairs, signed by the signer, run: the entries a local report writes, the same numbers
    out = service.report_pairs(
        ctx, Identity("tok-a", "team-a", False), a.sweep_id, service.ReportPairsRequest(n_boot=50)
    )
    assert sorted(out["names"]) == sorted([mine["pair"], other["pair"]]) and pair_jobs(conn, "team-a") == 2
    report_worker(["team-a"], connection=conn, store=store, key=KEY, max_job_bytes=2**20, beat_s=0.2).work(burst=True)
    new = after["team-a"] ^ cache_names(store, "team-a", a.sweep_id)
    written = {n: store.read_json(paths.report_key("team-a", a.sweep_id, f"cache/{n}")) for n in new}
    assert sorted(written) == sorted(f"pair-{d['pair']}.json" for d in (mine, other))
    _, by_workers = build(store, "team-a", a.sweep_id, n_boot=50)
    pd.testing.assert_frame_equal(by_workers, summarize(a, n_boot=50), check_exact=True)


def test_a_pair_payload_is_bound_to_its_tenant_sweep_and_settings():
    pair_refusal = PairJob.refusal
    doc = pair_payload("team-a", "sweepaaaaaaaaaaa", "a" * 32, "b" * 32, ["mean_length"], 50, 0, None)
    assert pair_refusal(doc, "team-a") is None
    for change in ({"seed": 1}, {"n_boot": 51}, {"baseline": "greedy"}, {"base": "c" * 32}, {"sweep_id": "sweepother"}):
        assert "digest is not its cells' and settings'" in pair_refusal(doc | change, "team-a"), change
    assert "baseline" in pair_refusal(doc | {"baseline": "x" * 2000}, "team-a")
    assert "names" in pair_refusal(doc | {"names": ["mean_length", "mean_length"]}, "team-a")


def test_a_tenant_asks_the_server_for_its_pairs_only_within_its_quota(
    redis_url, tmp_path, signing_key_file, tiny_model
):
    import redis

    from tests.support.server import deployment

    conn = redis.Redis.from_url(redis_url)
    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model) as dep:
        store = open_store(dep.extra["store"])
        a, _ = cached_sweep(store, "team-a", "sweepaaaaaaaaaaa")
        queue = keys.rq_queue_key(keys.report_queue("team-a"))
        with dep.client("bob") as bob:
            r = bob.post(f"/v1/sweeps/{a.sweep_id}/report-pairs", json={"n_boot": 50})
            assert r.status_code == 404, r.text
        with dep.client("alice") as alice:
            for bad in ({"baseline": "x" * 2000}, {"baseline": "greedy\n"}, {"n_boot": 10**9}, {"store": "x"}):
                r = alice.post(f"/v1/sweeps/{a.sweep_id}/report-pairs", json={"n_boot": 50, **bad})
                assert r.status_code == 400, (bad, r.text)
            assert conn.llen(queue) == 0
            r = alice.post(f"/v1/sweeps/{a.sweep_id}/report-pairs", json={"n_boot": 50})
            assert r.status_code == 200 and r.json()["enqueued"] == 2 and conn.llen(queue) == 2, r.text
            r = alice.post(f"/v1/sweeps/{a.sweep_id}/report-pairs", json={"n_boot": 50})
            assert r.status_code == 200 and conn.llen(queue) == 2  # the same pairs: waited for, not queued again
            # quota.queued_report_cells is 3 for team-a: cells and pairs wait in one queue, counted together
            r = alice.post(f"/v1/sweeps/{a.sweep_id}/report-pairs", json={"n_boot": 50, "baseline": "top_k"})
        assert r.status_code == 429 and "quota.queued_report_cells is 3" in r.json()["error"], r.text
        assert conn.llen(queue) == 2 and pair_jobs(conn, "team-b") == 0
