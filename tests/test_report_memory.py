"""What the controller holds of a sweep loaded without its generations: a compact summary of each job
(controller.report.jobs), its shared parts once, and cell tasks that carry job ids and hashes only.
The memory this saves is measured in benchmarks/bench_report.py; here the structure is pinned."""

from __future__ import annotations

import pandas as pd

from controller.metrics import METRICS
from controller.report import cells
from controller.report.aggregate import cell_tasks, load_sweep, summarize
from tests.helpers_report import make_sweep
from tests.test_report_scale import CELLS, write_with_hashes
from worker.core import paths
from worker.core.contract import JobResult
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
