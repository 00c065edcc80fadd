"""A report that scales: cells aggregated in a process pool, streamed from the store, cached per cell."""

from __future__ import annotations

import hashlib

import pandas as pd

from controller.report import cells
from controller.report.aggregate import load_sweep, summarize
from controller.report.write import build
from tests.helpers_report import make_sweep
from worker.core import paths
from worker.store import FileStore
from worker.store.base import jsonl_bytes

CELLS = [("m", "greedy", {}), ("m", "top_p", {"p": 0.9}), ("m", "top_k", {"k": 5}), ("n", "greedy", {})]


def write_with_hashes(store, data, *, change: str | None = None) -> None:
    """Write the sweep as workers do, result.json carrying its generations' SHA-256; `change` a job's texts."""
    store.write_json(paths.spec_key(data.tenant, data.sweep_id), data.spec)
    for r in data.results:
        rows = [g.model_dump() for g in data.generations if g.job_id == r.job.job_id]
        if r.job.job_id == change:
            rows = [{**row, "text": row["text"] + " again"} for row in rows]
        body = jsonl_bytes(rows)
        store.write_bytes(paths.generations_key(data.tenant, data.sweep_id, r.job.job_id), body)
        result = r.model_copy(update={"generations_sha256": hashlib.sha256(body).hexdigest()})
        store.write_json(paths.result_key(data.tenant, data.sweep_id, r.job.job_id), result.model_dump(mode="json"))


def test_pooled_and_streamed_reports_equal_the_in_memory_one(tmp_path):
    data = make_sweep(seeds=(0, 1), n_prompts=6, cells=CELLS)
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
    data = make_sweep(seeds=(0, 1), n_prompts=6, cells=CELLS)
    store = FileStore(tmp_path / "s")
    write_with_hashes(store, data)
    ran: list[str] = []
    real = cells.run_cell
    monkeypatch.setattr(cells, "run_cell", lambda task, *a: ran.append(task.cell) or real(task, *a))
    _, first = build(store, data.tenant, data.sweep_id, n_boot=100)
    assert len(ran) == 4
    cached = [k.rsplit("/", 1)[1] for k in store.list(paths.report_key(data.tenant, data.sweep_id, "cache/"))]
    assert len([k for k in cached if not k.startswith("pair-")]) == 4  # one per cell
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
