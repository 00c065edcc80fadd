"""The report planner's memo (controller.report.distribute.plancache, issue 25 item 7): `report --distributed`
asks the planner (the submission server, or the operator's own process) for the cells, then for the
pairs; the second call, and a report asked again of an unchanged sweep, plan from what the first
remembered instead of reading every job's result.json again, and a sweep that changed in between
(a job retried, a result added) is planned afresh. Against a real redis-server and, for the S3
listing's version tags, the loopback S3 endpoint."""

from __future__ import annotations

import pytest

from controller.report.api import build
from controller.report.distribute.plancache import PlanMemo, fingerprint
from controller.report.distribute.signer import plan_pairs
from controller.report.load import snapshot
from controller.server import service
from controller.server.tokens import Identity
from tests.support.report import CELLS, make_sweep, write_with_hashes
from tests.support.services import SIGNING_KEY as KEY
from worker.core import paths
from worker.store import FileStore, open_store

SETTINGS = {"n_boot": 50, "seed": 0, "n_boot_corpus": 100}


def results_read(store, monkeypatch) -> list[str]:
    """Every result.json, and the sweep's results snapshot (controller.report.load.snapshot), this store
    instance reads from now on."""
    read: list[str] = []
    real = store.read_bytes
    wanted = ("/result.json", "/" + snapshot.NAME)
    monkeypatch.setattr(
        store, "read_bytes", lambda key, *rest: (key.endswith(wanted) and read.append(key)) or real(key, *rest)
    )
    return read


def results(read: list[str]) -> list[str]:
    return [k for k in read if k.endswith("/result.json")]


def cached_cells(store, data) -> None:
    """The sweep written and reported once, then its pairs taken out of the cache (its cells stay)."""
    write_with_hashes(store, data)
    build(store, data.tenant, data.sweep_id, n_boot=SETTINGS["n_boot"])
    for key in store.list(paths.report_key(data.tenant, data.sweep_id, "cache/pair-")):
        store.delete(key)


def ask(ctx, data, what: str) -> dict:
    who = Identity("tok", data.tenant, False)
    if what == "cells":
        return service.report_cells(ctx, who, data.sweep_id, service.ReportCellsRequest(**SETTINGS))
    return service.report_pairs(ctx, who, data.sweep_id, service.ReportPairsRequest(**SETTINGS))


def test_the_pairs_and_a_repeated_report_are_planned_without_reading_the_results_again(
    redis_url, s3_bucket, monkeypatch
):
    import redis

    store = open_store(f"s3://{s3_bucket}/runs")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:4])
    cached_cells(store, data)
    fresh_pairs = plan_pairs(store, data.tenant, data.sweep_id, baseline=None, **SETTINGS)  # no memo: from the store
    ctx = service.Context(conn=redis.Redis.from_url(redis_url), store=store, signing_key=KEY, tenants=None, limits=None)
    read = results_read(store, monkeypatch)
    store.delete(snapshot.key_of(data.tenant, data.sweep_id))  # the reports so far left one

    cells = ask(ctx, data, "cells")  # planned from the store: every result read once, and remembered
    assert cells["cells"] == 4 and cells["missing"] == 0 and len(results(read)) == len(data.results)
    read.clear()
    pairs = ask(ctx, data, "pairs")  # from the memo: no result read, nor the results snapshot
    assert read == []
    assert (
        pairs["pairs"] == fresh_pairs[0] > 0
        and len(fresh_pairs[1]) == fresh_pairs[0]
        and pairs["names"] == [j.digest for j in fresh_pairs[1]]
    )
    again = ask(ctx, data, "cells")  # the same report asked again: every cell cached, nothing read
    assert read == [] and again == cells


def test_a_sweep_that_changed_since_it_was_planned_is_planned_afresh(redis_url, tmp_path, monkeypatch):
    import redis

    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:3])
    cached_cells(store, data)
    ctx = service.Context(conn=redis.Redis.from_url(redis_url), store=store, signing_key=KEY, tenants=None, limits=None)
    assert ask(ctx, data, "cells")["missing"] == 0
    read = results_read(store, monkeypatch)

    retried = data.results[0].job.job_id  # a retry rewrites a job: its cell is another cell now
    write_with_hashes(store, data, change=retried)
    read.clear()
    cells = ask(ctx, data, "cells")
    # the memo's fingerprint no longer matches: planned from the store, the results snapshot and what
    # changed since it was written (the retried job, read again)
    assert snapshot.key_of(data.tenant, data.sweep_id) in read and any(f"/{retried}/" in k for k in results(read))
    assert cells["missing"] == 1 and cells["enqueued"] == 1
    read.clear()
    pairs = ask(ctx, data, "pairs")
    assert read == []  # the new plan was remembered
    fresh = plan_pairs(store, data.tenant, data.sweep_id, baseline=None, **SETTINGS)
    assert pairs["pairs"] == fresh[0] and pairs["names"] == [j.digest for j in fresh[1]]


def test_the_memo_answers_only_for_its_sweep_settings_and_fingerprint(tmp_path):
    from controller.report.distribute import plancache

    store = FileStore(tmp_path / "s")
    a = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2])
    write_with_hashes(store, a)
    memo = PlanMemo(size=2)
    first = plancache.lookup(memo, store, a.tenant, a.sweep_id, 50, 0, 100)
    assert first.basis is None
    _, basis = first.plan()
    assert plancache.lookup(memo, store, a.tenant, a.sweep_id, 50, 0, 100).basis == basis
    assert plancache.lookup(memo, store, a.tenant, a.sweep_id, 50, 1, 100).basis is None  # another seed
    assert plancache.lookup(memo, store, "team-b", a.sweep_id, 50, 0, 100).basis is None  # another tenant
    for seed in (1, 2):  # two more plans: the memo keeps the last two
        plancache.lookup(memo, store, a.tenant, a.sweep_id, 50, seed, 100).plan()
    assert plancache.lookup(memo, store, a.tenant, a.sweep_id, 50, 0, 100).basis is None
    small = PlanMemo(max_cells=3)  # a bound on the cells over all sweeps (each basis here has 2)
    for seed in (0, 1):
        plancache.lookup(small, store, a.tenant, a.sweep_id, 50, seed, 100).plan()
    found = [plancache.lookup(small, store, a.tenant, a.sweep_id, 50, seed, 100).basis for seed in (0, 1)]
    assert found[0] is None and found[1] is not None and len(found[1].cells) == 2
    tiny = PlanMemo(max_cells=1)
    tiny.put(("k",), "fp", basis)
    assert tiny.get(("k",), "fp") is None  # a basis larger than the whole memo is not kept
    assert plancache.lookup(None, store, a.tenant, a.sweep_id, 50, 2, 100).basis is None  # no memo, nothing found
    # anything a plan reads changes the fingerprint: a job's files, the spec, the plan; the report cache does not
    before = fingerprint(store, a.tenant, a.sweep_id)
    store.write_json(paths.report_key(a.tenant, a.sweep_id, "cache/x.json"), {})
    assert fingerprint(store, a.tenant, a.sweep_id) == before
    for key in (paths.spec_key(a.tenant, a.sweep_id), paths.result_key(a.tenant, a.sweep_id, a.results[0].job.job_id)):
        store.write_bytes(key, store.read_bytes(key) + b" ")
        assert fingerprint(store, a.tenant, a.sweep_id) != before
        before = fingerprint(store, a.tenant, a.sweep_id)


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_list_versions_names_the_listed_keys_and_changes_when_an_object_is_rewritten(kind, tmp_path, request):
    store = (
        FileStore(tmp_path / "s") if kind == "file" else open_store(f"s3://{request.getfixturevalue('s3_bucket')}/r")
    )
    for key, body in (("t/a/1.json", b"one"), ("t/a/2.json", b"two"), ("t/b/3.json", b"three")):
        store.write_bytes(key, body)
    tags = store.list_versions("t/a/")
    assert sorted(tags) == store.list("t/a/") == ["t/a/1.json", "t/a/2.json"]
    store.write_bytes("t/a/1.json", b"uno")
    after = store.list_versions("t/a/")
    assert after["t/a/1.json"] != tags["t/a/1.json"] and after["t/a/2.json"] == tags["t/a/2.json"]


def test_a_plan_lists_the_sweeps_jobs_once_and_plans_the_jobs_of_that_listing(tmp_path, monkeypatch):
    """On a memo miss the fingerprint's listing (a page per 1,000 keys from S3) also names the complete
    jobs: the jobs are not listed a second time, and a job that completes after it waits for the next plan."""
    from controller.report.distribute import plancache

    store = FileStore(tmp_path / "s")
    a = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2])
    late = a.results[-1].job.job_id
    write_with_hashes(store, a)
    key = paths.result_key(a.tenant, a.sweep_id, late)
    body = store.read_bytes(key)
    store.delete(key)  # not complete when the planner lists the jobs
    listings: list[str] = []
    for name in ("list", "list_versions"):
        real = getattr(store, name)
        monkeypatch.setattr(store, name, lambda prefix, real=real: listings.append(prefix) or real(prefix))
    found = plancache.lookup(PlanMemo(), store, a.tenant, a.sweep_id, 50, 0, 100)
    store.write_bytes(key, body)  # completes between the listing and the read
    tasks, _ = found.plan()
    assert listings.count(paths.jobs_prefix(a.tenant, a.sweep_id)) == 1
    assert late not in {job_id for t in tasks for job_id, _ in t.jobs}
    assert sum(len(t.jobs) for t in tasks) == len(a.results) - 1
