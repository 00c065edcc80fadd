"""What the controller holds of a sweep loaded without its generations: a compact summary of each job
(controller.report.load.jobs), its shared parts once, and cell tasks that carry job ids and hashes only.
The memory this saves is measured in benchmarks/bench_report.py; here the structure is pinned."""

from __future__ import annotations

import pandas as pd

from controller.metrics import METRICS
from controller.report.compute import cells
from controller.report.compute.aggregate import cell_tasks, summarize
from controller.report.load.sweep import load_sweep
from tests.support.report import CELLS, make_sweep, write_with_hashes
from worker.core import paths
from worker.core.results import JobResult
from worker.store import FileStore


def written(tmp_path):
    """Four cells over two models, two seeds, three shards of four prompts: every cell repeats the shards."""
    data = make_sweep(seeds=(0, 1), n_prompts=12, shard_size=4, cells=CELLS)
    store = FileStore(tmp_path / "s")
    write_with_hashes(store, data)
    return data, store


def test_a_streamed_sweep_holds_each_prompt_once_and_no_job_result(tmp_path):
    data, store = written(tmp_path)
    streamed = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert len(streamed.results) == len(data.results) > 12
    assert not any(isinstance(r, JobResult) for r in streamed.results)
    prompts = [p for r in streamed.results for p in r.job.prompts]
    assert len({id(p.prompt) for p in prompts}) == 12  # each distinct prompt text once, however many jobs
    assert len({id(r.job.prompts) for r in streamed.results}) == 3  # one list per shard
    assert len({id(r.job.model) for r in streamed.results}) == 2
    assert len({id(r.provenance) for r in streamed.results}) == 2  # the models' hashes differ; the seed is left out
    assert streamed.prompts == data.prompts and streamed.n_generations == len(data.generations)


def test_a_cell_task_carries_ids_and_hashes_and_the_digest_of_whole_results(tmp_path, monkeypatch):
    data, store = written(tmp_path)
    whole = load_sweep(store, data.tenant, data.sweep_id)  # JobResults, as a sweep with its generations keeps them
    streamed = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    _, settings, tasks = cell_tasks(streamed, 50, 0, 50, METRICS, store)
    _, _, from_whole = cell_tasks(whole, 50, 0, 50, METRICS, store)
    assert [t.cell for t in tasks] == [t.cell for t in from_whole]
    for task, other in zip(tasks, from_whole):
        assert task.jobs == other.jobs and all(isinstance(j, str) and isinstance(h, str) for j, h in task.jobs)
        assert cells.digest(task, settings) == cells.digest(other, settings)  # the cache keys do not change
    # the map reads each job's generations by id and hash; no result.json is read again
    read: list[tuple[str, str]] = []
    real = FileStore.load_generations
    monkeypatch.setattr(FileStore, "load_result", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read")))
    monkeypatch.setattr(FileStore, "load_generations", lambda s, t, w, j, h: read.append((j, h)) or real(s, t, w, j, h))
    summary = summarize(streamed, n_boot=50, store=store)
    assert sorted(read) == sorted(j for t in tasks for j in t.jobs)
    pd.testing.assert_frame_equal(summary, summarize(data, n_boot=50))  # the numbers of the sweep in memory


def test_a_damaged_result_is_named_and_left_out_of_a_streamed_sweep(tmp_path):
    data, store = written(tmp_path)
    job_id = data.results[0].job.job_id
    key = paths.result_key(data.tenant, data.sweep_id, job_id)
    store.write_bytes(key, store.read_bytes(key)[:-7])
    streamed = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert len(streamed.results) == len(data.results) - 1 and job_id not in {r.job.job_id for r in streamed.results}
    assert len(streamed.damaged) == 1 and job_id in streamed.damaged[0]


def test_the_reduce_holds_each_cell_as_a_row_and_reads_compared_statistics_from_the_cache(tmp_path, monkeypatch):
    """A cached cell's per-prompt statistics (the part of its output that grows with the prompts) are not
    held for the whole table: a comparison reads both cells' again, each baseline once, and the numbers
    are those of the sweep in memory."""
    from controller.report.compute import aggregate, pairs

    data, store = written(tmp_path)
    held: list = []
    real_map = aggregate.cell_outputs
    monkeypatch.setattr(aggregate, "cell_outputs", lambda *a, **k: held.extend(out := real_map(*a, **k)) or out)
    reads: list[str] = []
    real_read = pairs.from_json
    monkeypatch.setattr(pairs, "from_json", lambda doc: reads.append(doc["stats"]["cell"]) or real_read(doc))
    streamed = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    summary = summarize(streamed, n_boot=50, store=store)
    assert len(held) == 4 and all(o.spilled and o.stats.kept == {} and o.stats.prompts == [] for o in held)
    assert all(o.stats.values for o in held)  # the values stay: the table's rows and who is compared with whom
    # two models: m's baseline compared with two cells, n's with none; three cells read, the baseline once
    assert len(reads) == len(set(reads)) == 3
    pd.testing.assert_frame_equal(summary, summarize(data, n_boot=50))


def test_a_compared_cell_whose_cache_entry_left_meanwhile_is_computed_again(tmp_path, monkeypatch):
    from controller.report.compute import aggregate

    data, store = written(tmp_path)
    real_map = aggregate.cell_outputs

    def then_delete(*a, **k):  # report/cache/ deleted while the report runs: safe, as it is between reports
        out = real_map(*a, **k)
        for key in store.list(paths.report_key(data.tenant, data.sweep_id, "cache/")):
            store.delete(key)
        return out

    monkeypatch.setattr(aggregate, "cell_outputs", then_delete)
    summary = summarize(load_sweep(store, data.tenant, data.sweep_id, with_generations=False), n_boot=50, store=store)
    pd.testing.assert_frame_equal(summary, summarize(data, n_boot=50))


def test_per_request_timings_are_held_as_packed_floats_and_give_the_numbers_of_whole_results(tmp_path):
    """With continuous refill each batch carries a latency, a TTFT and a TPOT per request (tens of numbers a
    job): a JobInfo holds them as array("d"), 8 bytes a number, and the speed columns are those of the
    JobResults; a TPOT list with a None (a one-token generation) is kept as it is."""
    from array import array

    data = make_sweep(seeds=(0, 1), n_prompts=8, shard_size=4, cells=CELLS[:2])
    for k, r in enumerate(data.results):
        timed = []
        for i, b in enumerate(r.batches):
            per = [0.1 + 0.01 * (k + i + j) for j in range(b.n)]
            tpot = [None if (k, i, j) == (0, 0, 0) else t / 50 for j, t in enumerate(per)]
            timed.append(b.model_copy(update={"latency_s": per, "ttft_s": [t / 10 for t in per], "tpot_s": tpot}))
        data.results[k] = r.model_copy(update={"batches": timed})
    store = FileStore(tmp_path / "s")
    write_with_hashes(store, data)
    streamed = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    batches = [b for r in streamed.results for b in r.batches]
    assert all(isinstance(b.latency_s, array) and isinstance(b.ttft_s, array) for b in batches)
    assert sum(isinstance(b.tpot_s, list) and None in b.tpot_s for b in batches) == 1
    assert sum(isinstance(b.tpot_s, array) for b in batches) == len(batches) - 1
    summary = summarize(streamed, n_boot=50, store=store)
    whole = summarize(data, n_boot=50)
    speed = ["latency_ms_p50", "latency_ms_p95", "ttft_ms_p50", "decode_ms_per_token"]
    untimed = summarize(make_sweep(seeds=(0, 1), n_prompts=8, shard_size=4, cells=CELLS[:2]), n_boot=50)
    assert summary[speed].iloc[:2].notna().all().all()  # the two cells (the reference row has no speed)
    assert (summary[speed].iloc[:2] != untimed[speed].iloc[:2]).all().all()  # the per-request timings were read
    pd.testing.assert_frame_equal(summary, whole)  # every speed column, exactly
