"""A report that scales: cells aggregated in a process pool, streamed from the store, cached per cell."""

from __future__ import annotations

import pandas as pd

from controller.report.api import build
from controller.report.compute import celljob, cells
from controller.report.compute.aggregate import summarize
from controller.report.load.sweep import load_sweep
from tests.support.report import CELLS, make_sweep, write_with_hashes
from worker.core import paths
from worker.store import FileStore


def test_pooled_and_streamed_reports_equal_the_in_memory_one(tmp_path):
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS)
    store = FileStore(tmp_path / "s")
    write_with_hashes(store, data)
    memory = summarize(data, n_boot=100)
    streamed = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert streamed.generations == [] and streamed.n_generations == len(data.generations)
    pooled = summarize(streamed, n_boot=100, workers=2, store=store)  # cells and pairs in the pool
    pd.testing.assert_frame_equal(memory, pooled)
    cached = summarize(load_sweep(store, data.tenant, data.sweep_id, with_generations=False), n_boot=100, store=store)
    pd.testing.assert_frame_equal(memory, cached)
    assert set(streamed.examples) == {
        (r["cell"], p) for r in memory.to_dict("records")[:4] for p in ("p000", "p001", "p002")
    }


def test_a_report_after_a_retry_recomputes_only_the_changed_cell(tmp_path, monkeypatch):
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS)
    store = FileStore(tmp_path / "s")
    write_with_hashes(store, data)
    ran: list[str] = []
    real = celljob.run_cell
    monkeypatch.setattr(celljob, "run_cell", lambda task, *a: ran.append(task.cell) or real(task, *a))
    _, first = build(store, data.tenant, data.sweep_id, n_boot=100)
    assert len(ran) == 4
    cached = [k.rsplit("/", 1)[1] for k in store.list(paths.report_key(data.tenant, data.sweep_id, "cache/"))]
    assert len([k for k in cached if not k.startswith("pair-") and k != "results.jsonl.gz"]) == 4  # one per cell
    assert len([k for k in cached if k.startswith("pair-")]) == 2  # one per compared pair (two models)
    ran.clear()
    _, again = build(store, data.tenant, data.sweep_id, n_boot=100)
    assert ran == []  # every cell from the cache, same numbers
    pd.testing.assert_frame_equal(first, again)
    retried = next(r.job for r in data.results if r.job.strategy.name == "top_p")
    write_with_hashes(store, data, change=retried.job_id)  # the retry wrote other texts
    _, after = build(store, data.tenant, data.sweep_id, n_boot=100)
    assert ran == [retried.cell]
    row = lambda s: s[s["cell"] == retried.cell].iloc[0]
    assert row(after)["mean_length"] > row(first)["mean_length"]


def test_the_report_reads_s3_several_records_at_a_time_in_order(s3_bucket, monkeypatch):
    """An S3 read is a round trip (tens of ms); the report's result.json per job and each cell's generations
    are read `read_concurrency` at once (on the loopback S3 endpoint here), kept in order, a damaged job
    still named and left out. A local disk reads one at a time (threads only share its parsing CPU)."""
    import threading
    import time

    from worker.store import open_store
    from worker.store.s3 import S3Store

    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS)
    store = open_store(f"s3://{s3_bucket}/runs")
    write_with_hashes(store, data)
    victim = sorted(r.job.job_id for r in data.results)[3]
    key = paths.result_key(data.tenant, data.sweep_id, victim)
    store.write_bytes(key, store.read_bytes(key)[:-5])
    in_flight, most, lock = [0], [0], threading.Lock()
    real = S3Store.read_bytes

    def counted(self, key, *rest):  # a round trip, counted while it lasts
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            time.sleep(0.01)
            return real(self, key, *rest)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(S3Store, "read_bytes", counted)
    streamed = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert most[0] > 1  # reads overlapped (one at a time before)
    kept = sorted(r.job.job_id for r in data.results if r.job.job_id != victim)
    assert [r.job.job_id for r in streamed.results] == kept
    assert len(streamed.damaged) == 1 and victim in streamed.damaged[0]
    most[0] = 0
    task = next(t for t in cells_of(streamed, store) if len(t.jobs) > 1)
    records, damaged = cells.cell_records(task)
    assert most[0] > 1 and damaged == []
    assert [g.job_id for g in records] == [g.job_id for j, _ in task.jobs for g in data.generations if g.job_id == j]
    threaded = summarize(streamed, n_boot=50, store=store)
    monkeypatch.setattr(store, "read_concurrency", 1)  # one read at a time, everything in memory: the same report
    pd.testing.assert_frame_equal(threaded, summarize(load_sweep(store, data.tenant, data.sweep_id), n_boot=50))
    assert FileStore.read_concurrency == 1


def cells_of(streamed, store):
    from controller.metrics import METRICS
    from controller.report.compute.aggregate import cell_tasks

    return cell_tasks(streamed, 50, 0, 50, METRICS, store)[2]


def test_the_report_command_says_how_far_it_is_phase_by_phase_on_stderr(tmp_path, monkeypatch):
    """A team sweep's report takes minutes: without a terminal it prints a line per tenth of each phase
    (the results read, the cells, the pairs) and at each phase's end, on stderr (stdout keeps the
    table); --no-progress prints none. A second report reads every cell and pair from the cache."""
    import shutil

    from click.testing import CliRunner

    from controller.cli import main

    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS)
    write_with_hashes(FileStore(tmp_path / "s"), data)
    args = ["report", data.sweep_id, "--store", str(tmp_path / "s"), "--n-boot", "50"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    lines = [line for line in first.stderr.splitlines() if line.startswith("report: ") and line.endswith("s)")]
    phases = [line.split()[1] for line in lines]
    assert phases == sorted(phases, key=["results", "cells", "pairs"].index)  # in order, each phase's lines together
    n_jobs = len(data.results)
    assert f"report: results {n_jobs}/{n_jobs} (" in first.stderr and "report: cells 4/4 (" in first.stderr
    assert "report: pairs 2/2 (" in first.stderr  # two models: two cells compared with their model's first
    assert len([p for p in phases if p == "results"]) <= 10 + 1 and "report: " not in first.stdout
    shutil.rmtree(tmp_path / "s" / data.tenant / "sweeps" / data.sweep_id / "report" / "cache")
    pooled = CliRunner().invoke(main, [*args, "--workers", "2"])  # cells, then pairs, in a process pool
    assert pooled.exit_code == 0 and "report: cells 4/4 (" in pooled.stderr and "report: pairs 2/2 (" in pooled.stderr
    quiet = CliRunner().invoke(main, [*args, "--no-progress"])
    assert quiet.exit_code == 0 and not [line for line in quiet.stderr.splitlines() if "/" in line and "cells" in line]


def test_progress_lines_come_at_each_tenth_and_once_at_the_end(capsys):
    from controller.cli.progress import ReportProgress

    with ReportProgress(None) as tick:
        tick("cells", 0, 95)
        for done in range(1, 96):
            tick("cells", done, 95)
        tick("cells", 95, 95)  # the end again (a phase that ticks once more): not printed twice
        tick("pairs", 3, 3)
    err = capsys.readouterr().err.splitlines()
    assert [line.split()[2] for line in err] == [f"{d}/95" for d in (10, 19, 29, 38, 48, 57, 67, 76, 86, 95)] + ["3/3"]
    with ReportProgress(False) as tick:
        tick("cells", 5, 5)
    assert capsys.readouterr().err == ""


def test_the_wait_for_report_workers_spends_at_most_a_tenth_of_its_time_listing_the_cache(tmp_path, monkeypatch):
    """A big report's cache holds thousands of entries; polling it every 0.5 s whatever a listing costs
    took a core's share from the report workers beside it. The wait now sleeps long enough that its
    listings are at most cache.LIST_SHARE of its time."""
    import time

    from controller.report.compute import cache

    store = FileStore(tmp_path / "s")
    real, calls = store.list, []

    def slow_list(prefix):  # a listing of 30 ms, a large cache's
        calls.append(time.monotonic())
        time.sleep(0.03)
        return real(prefix)

    monkeypatch.setattr(store, "list", slow_list)
    t0 = time.monotonic()
    came = list(
        cache.ReportCache(store, "default", "sweep0000000000a").arrivals(
            ["a" * 32], stall_s=1.0, poll_s=0.01, what="cells"
        )
    )
    assert came == []  # nothing came: given back to compute here
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert gaps and min(gaps) >= 0.27  # 30 ms of listing, then sleep until it is a tenth: >= 0.3 s apart
    listing = 0.03 * len(calls)
    assert listing <= cache.LIST_SHARE * (time.monotonic() - t0) + 0.03  # the last listing is not slept after
