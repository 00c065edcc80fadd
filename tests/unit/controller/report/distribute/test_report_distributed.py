"""The report's map over the cluster (issue 25, item 7): one signed job per cell on the tenant's
report queue, run by `decodebench report-worker` processes, against a real redis-server and the
moto S3 store; the controller reduces as in local mode."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from controller.cli import main as cli
from controller.report.api import build
from controller.report.compute import celljob
from controller.report.compute.aggregate import summarize
from controller.report.compute.cache import ReportCache
from controller.report.distribute.mapworker import report_worker
from controller.report.distribute.remote import ReportWorkers
from controller.report.distribute.signer import Admission, enqueue, job_id_of
from controller.report.load import snapshot
from controller.report.load.sweep import load_sweep
from tests.support.report import CELLS, make_sweep, write_with_hashes
from tests.support.reportworkers import operator, plant, report_workers
from tests.support.services import SIGNING_KEY as KEY
from worker.core import keys, paths, rqadapter
from worker.store import FileStore, open_store

BIN = Path(sys.executable).parent


pytestmark = pytest.mark.usefixtures("restore_signals")  # tests/conftest.py: the in-process report worker's handlers


def cache_entries(store, tenant: str, sweep_id: str) -> list[str]:
    """The names in a sweep's report cache but the results snapshot's (controller.report.load.snapshot)."""
    names = [k.rsplit("/", 1)[1] for k in store.list(paths.report_key(tenant, sweep_id, "cache/"))]
    return [n for n in names if n != snapshot.NAME]


def report_jobs(conn, tenant: str = "default") -> int:
    return len(conn.keys(keys.rq_job_prefix(tenant) + "cell-*"))


@pytest.fixture
def here(monkeypatch) -> list[str]:
    """The cells computed by this process (not by a report worker), as they are."""
    cells: list[str] = []
    real = celljob.run_cell
    monkeypatch.setattr(celljob, "run_cell", lambda task, *a: cells.append(task.cell) or real(task, *a))
    return cells


def test_a_distributed_report_equals_the_local_one_and_recomputes_only_changed_cells(redis_url, s3_bucket, here):
    import redis

    conn = redis.Redis.from_url(redis_url)
    url = f"s3://{s3_bucket}/runs"
    store = open_store(url)
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS)
    write_with_hashes(store, data)
    local = summarize(data, n_boot=100)  # every record in memory, one process
    with report_workers(2, redis_url, url):
        dispatch = ReportWorkers(operator(redis_url, url), stall_s=90)
        here.clear()  # (the local summary's)
        _, first = build(store, data.tenant, data.sweep_id, n_boot=100, remote=dispatch)
        pd.testing.assert_frame_equal(local, first)
        assert report_jobs(conn) == 4 and here == []  # every cell by a report worker

        retried = next(r.job for r in data.results if r.job.strategy.name == "top_p")
        write_with_hashes(store, data, change=retried.job_id)  # a retry wrote other texts
        _, after = build(store, data.tenant, data.sweep_id, n_boot=100, remote=dispatch)
        assert report_jobs(conn) == 5 and here == []  # that cell only, by a report worker
        row = lambda s: s[s["cell"] == retried.cell].iloc[0]
        assert row(after)["mean_length"] > row(first)["mean_length"]
        unchanged = after[after["cell"] != retried.cell].drop(columns=[c for c in after if "_diff" in c])
        expected = first[first["cell"] != retried.cell].drop(columns=[c for c in first if "_diff" in c])
        pd.testing.assert_frame_equal(unchanged, expected)

        r = CliRunner().invoke(
            cli,
            ["report", data.sweep_id, "--distributed", "--n-boot", "100", "--store", url, "--redis-url", redis_url],
        )
        assert r.exit_code == 0, r.output
        assert report_jobs(conn) == 5 and here == []  # everything from the cache: no job, nothing here


def test_cells_no_report_worker_delivers_are_computed_by_the_controller(redis_url, tmp_path, here):
    import redis

    conn = redis.Redis.from_url(redis_url)
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2])
    write_with_hashes(store, data)
    dispatch = ReportWorkers(operator(redis_url, str(tmp_path / "s")), stall_s=0.5, poll_s=0.1)
    _, summary = build(store, data.tenant, data.sweep_id, n_boot=50, remote=dispatch)  # no worker runs
    assert report_jobs(conn) == 2 and sorted(here) == sorted({g.cell for g in data.generations})
    pd.testing.assert_frame_equal(summary, summarize(data, n_boot=50))


# -- hostile ---------------------------------------------------------------------------------------


def test_unsigned_forged_and_cross_tenant_report_jobs_are_refused(redis_url, tmp_path):
    import redis

    conn = redis.Redis.from_url(redis_url)
    store = FileStore(tmp_path / "s")
    a = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2], tenant="team-a", sweep_id="sweepaaaaaaaaaaa")
    b = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2], tenant="team-b", sweep_id="sweepbbbbbbbbbbb")
    write_with_hashes(store, a)
    write_with_hashes(store, b)
    sb = load_sweep(store, "team-b", b.sweep_id, with_generations=False)
    from controller.metrics import METRICS
    from controller.report.compute.aggregate import cell_tasks

    _, settings, tasks = cell_tasks(sb, 50, 0, 50, METRICS, store)
    job_b = celljob.cell_job(tasks[0], settings, None, cached=True)
    theirs = job_b.payload()  # team-b's cell
    call = lambda doc, f=keys.REPORT_FUNCTION: [f, None, [doc], {}]
    planted = {
        "unsigned": (call(theirs | {"tenant": "team-a"}), None, "not signed"),
        "forged": (call(theirs | {"tenant": "team-a"}), b"another-key-of-at-least-32-bytes-xxxx", "does not verify"),
        "cross-tenant": (call(theirs), KEY, "a report job of tenant 'team-b' on the report queue of tenant 'team-a'"),
        "gpu-function": (call(theirs | {"tenant": "team-a"}, keys.RQ_FUNCTION), KEY, "not " + keys.REPORT_FUNCTION),
        "bad-metric": (call(theirs | {"tenant": "team-a", "settings": {**theirs["settings"], "names": ["os"]}}), KEY,
                       "unknown metric 'os'"),
        "bad-units": (call(theirs | {"tenant": "team-a", "units": [[1, 2, 3]]}), KEY, "not [tokens, seconds] pairs"),
    }  # fmt: skip
    for job_id, (c, key, _) in planted.items():
        plant(conn, "team-a", job_id, c, key)
    worker = report_worker(["team-a"], connection=conn, store=store, key=KEY, max_job_bytes=2**20, beat_s=0.2)
    worker.work(burst=True)
    for job_id, (_, _, reason) in planted.items():
        job = rqadapter.fetch(conn, rqadapter.tenant_job_class("team-a"), job_id)
        assert job.get_status() == "failed" and reason in job.meta["reason"], (job_id, job.meta)
    # nothing written for team-b (the results snapshot is the signer's planning load's, above)
    assert cache_entries(store, "team-b", b.sweep_id) == []
    assert cache_entries(store, "team-a", a.sweep_id) == []

    # the signer builds a tenant's cells from its own prefix of the store: team-a cannot name team-b's sweep
    from controller.server import service
    from controller.server.errors import NotFound
    from controller.server.tokens import Identity

    ctx = service.Context(conn=conn, store=store, signing_key=KEY, tenants=None, limits=None)
    with pytest.raises(NotFound):
        service.report_cells(ctx, Identity("tok-a", "team-a", False), b.sweep_id, service.ReportCellsRequest())
    assert report_jobs(conn, "team-b") == 0 and report_jobs(conn, "team-a") == 0

    # a signed, well-formed job of team-a's own runs; one moved onto team-a's GPU queue is never a report
    mine = enqueue(conn, KEY, "team-b", b.sweep_id, [job_b], Admission())
    assert mine == 1 and conn.llen(keys.rq_queue_key(keys.report_queue("team-b"))) == 1
    report_worker(["team-b"], connection=conn, store=store, key=KEY, max_job_bytes=2**20, beat_s=0.2).work(burst=True)
    assert store.exists(ReportCache(store, "team-b", b.sweep_id).key(job_b.digest))
    job = rqadapter.fetch(conn, rqadapter.tenant_job_class("team-b"), job_id_of(job_b))
    assert job.get_status() == "finished"


def test_a_cell_a_report_worker_cannot_compute_is_marked_and_computed_by_the_controller(redis_url, tmp_path, here):
    import redis

    conn = redis.Redis.from_url(redis_url)
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2])
    write_with_hashes(store, data)
    broken = data.results[0].job
    key = paths.generations_key(data.tenant, data.sweep_id, broken.job_id)
    store.write_bytes(key, store.read_bytes(key) + b"\n")  # no longer what its result.json's hash says
    asked = operator(redis_url, str(tmp_path / "s")).report_cells(data.sweep_id, {"n_boot": 50})
    assert len(asked["digests"]) == 2
    report_worker(["default"], connection=conn, store=store, key=KEY, max_job_bytes=2**20, beat_s=0.2).work(burst=True)
    names = set(cache_entries(store, data.tenant, data.sweep_id))
    marks = [n for n in names if n.endswith(".fail.json")]
    assert len(marks) == 1 and len(names) == 2  # the other cell is cached
    reason = store.read_json(paths.report_key(data.tenant, data.sweep_id, f"cache/{marks[0]}"))["reason"]
    assert broken.job_id in reason
    dispatch = ReportWorkers(operator(redis_url, str(tmp_path / "s")), stall_s=0.5, poll_s=0.1)
    here.clear()  # (the in-process report worker's, above)
    got, summary = build(store, data.tenant, data.sweep_id, n_boot=50, remote=dispatch)
    assert here == [broken.cell]  # asked again (its mark cleared), not computed by a worker: computed here
    assert not store.exists(paths.report_key(data.tenant, data.sweep_id, f"cache/{marks[0]}"))
    assert any(broken.job_id in line for line in got.damaged)  # named, as a local report names it
    in_cell = [g for g in data.generations if g.cell == broken.cell and g.job_id != broken.job_id]
    assert summary[summary["cell"] == broken.cell].iloc[0]["n_generations"] == len(in_cell)  # the rest of it


def test_a_tenant_asks_the_server_for_its_report_cells_and_never_for_another_s(
    redis_url, tmp_path, signing_key_file, tiny_model
):
    from tests.support.server import deployment

    with deployment(tmp_path / "dep", redis_url, signing_key_file, tiny_model) as dep:
        store = open_store(dep.extra["store"])
        a = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2], tenant="team-a", sweep_id="sweepaaaaaaaaaaa")
        write_with_hashes(store, a)
        with dep.client("bob") as bob:
            r = bob.post(f"/v1/sweeps/{a.sweep_id}/report-cells", json={"n_boot": 50})
            assert r.status_code == 404
            r = bob.post(f"/v1/sweeps/{a.sweep_id}/report-cells", json={"n_boot": 10**9})
            assert r.status_code == 400
        token = tmp_path / "alice.token"
        token.write_text(dep.tokens["alice"])
        env = {"DECODEBENCH_TOKEN_FILE": str(token), "DECODEBENCH_STORE": dep.extra["store"]}
        with report_workers(1, redis_url, dep.extra["store"]):
            args = ["report", a.sweep_id, "--distributed", "--api", dep.url, "--n-boot", "50", "--wait-s", "60"]
            r = CliRunner().invoke(cli, args, env=env)
        assert r.exit_code == 0, r.output
        import redis

        assert report_jobs(redis.Redis.from_url(redis_url), "team-a") == 2
        assert len(redis.Redis.from_url(redis_url).keys(keys.rq_job_prefix("team-a") + "pair-*")) == 1  # and its pair
        assert report_jobs(redis.Redis.from_url(redis_url), "team-b") == 0
        _, distributed = build(store, "team-a", a.sweep_id, n_boot=50)  # from the cache the workers wrote
        for key in store.list(paths.report_key("team-a", a.sweep_id, "cache/")):
            store.delete(key)
        _, local = build(store, "team-a", a.sweep_id, n_boot=50)  # every cell computed here
        pd.testing.assert_frame_equal(distributed, local)
        # quota.queued_report_cells (3 for team-a): a new seed is a new set of cells, so without the quota
        # a token could fill the report queue; the refused report writes nothing
        queue = keys.rq_queue_key(keys.report_queue("team-a"))
        conn = redis.Redis.from_url(redis_url)
        with dep.client("alice") as alice:
            r = alice.post(f"/v1/sweeps/{a.sweep_id}/report-cells", json={"n_boot": 50, "seed": 1})
            assert r.status_code == 200 and r.json()["enqueued"] == 2, r.text
            r = alice.post(f"/v1/sweeps/{a.sweep_id}/report-cells", json={"n_boot": 50, "seed": 1})
            assert r.status_code == 200 and r.json()["enqueued"] == 0 and conn.llen(queue) == 2  # waited for
            r = alice.post(f"/v1/sweeps/{a.sweep_id}/report-cells", json={"n_boot": 50, "seed": 2})
        assert r.status_code == 429, r.text
        assert "quota.queued_report_cells is 3" in r.json()["error"] and conn.llen(queue) == 2


def test_with_a_tenants_file_a_report_worker_serves_the_declared_tenants_only():
    from controller.report.distribute.mapworker import ReportLogic
    from worker.core.errors import UsageError

    logic = ReportLogic(["*"], None, key=KEY, max_job_bytes=1, declared=["team-a", "team-b"])
    assert logic.selectors == ["team-a", "team-b"] and not logic.wildcard  # RQ's queue set is never read
    assert ReportLogic(["*"], None, key=KEY, max_job_bytes=1).wildcard
    with pytest.raises(UsageError, match="not declared"):
        ReportLogic(["team-x"], None, key=KEY, max_job_bytes=1, declared=["team-a"])
    with pytest.raises(UsageError, match="TENANT"):
        ReportLogic(["bad:name"], None, key=KEY, max_job_bytes=1)


def test_a_report_worker_refuses_a_cell_whose_timings_changed_since_it_was_asked_for(redis_url, tmp_path, here):
    """tokens/s's interval is the map's, from the batch units the job was signed with: a result.json
    rewritten with other timings (same generations, so the same hash) is not computed under that digest."""
    import redis

    conn = redis.Redis.from_url(redis_url)
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:1])
    write_with_hashes(store, data)
    asked = operator(redis_url, str(tmp_path / "s")).report_cells(data.sweep_id, {"n_boot": 50})
    (digest,) = asked["digests"]
    job = data.results[0].job
    key = paths.result_key(data.tenant, data.sweep_id, job.job_id)
    doc = store.read_json(key)
    doc["batches"][0]["total_s"] *= 3  # a rerun on a busier machine
    store.write_json(key, doc)
    report_worker(["default"], connection=conn, store=store, key=KEY, max_job_bytes=2**20, beat_s=0.2).work(burst=True)
    assert not store.exists(ReportCache(store, data.tenant, data.sweep_id).key(digest))
    mark = store.read_json(paths.report_key(data.tenant, data.sweep_id, f"cache/{digest}.fail.json"))
    assert "timings changed" in mark["reason"]
    # reported again, the cell is planned with the new timings and computed
    dispatch = ReportWorkers(operator(redis_url, str(tmp_path / "s")), stall_s=30, poll_s=0.1)
    here.clear()  # (the in-process report worker's, above)
    with report_workers(1, redis_url, str(tmp_path / "s")):
        _, summary = build(store, data.tenant, data.sweep_id, n_boot=50, remote=dispatch)
    assert here == []  # computed by the report worker
    row = summary[summary["cell"] == job.cell].iloc[0]
    assert row["tokens_per_s_ci_low"] < row["tokens_per_s"] < row["tokens_per_s_ci_high"]
