"""The summary's `decode_step` column (docs/performance.md#cuda-graphs): the decode step each cell's jobs ran
(result.json's `engine.decode_step`), present only where some cell ran another one than the eager step, so
every other sweep's report keeps its columns; the same read from the JobResults and from the store."""

from __future__ import annotations

import dataclasses

import pytest

from controller.report.compute.aggregate import summarize
from controller.report.load.sweep import load_sweep
from tests.support.report import make_sweep, write_sweep
from worker.store import FileStore

pytestmark = pytest.mark.pure


def _ran(data, steps: dict[str, list[str]]):
    """The sweep with each listed strategy's jobs recording these decode steps (one per job, in turn)."""
    seen: dict[str, int] = {}
    results = []
    for r in data.results:
        modes = steps.get(r.job.strategy.name)
        if modes:
            i = seen[r.job.strategy.name] = seen.get(r.job.strategy.name, -1) + 1
            record = {"mode": modes[i % len(modes)], "why": "decode_step: graphs", "graph_replays": 3}
            r = r.model_copy(update={"engine": {**(r.engine or {}), "decode_step": record}})
        results.append(r)
    return dataclasses.replace(data, results=results)


def test_no_column_where_every_cell_ran_the_eager_step():
    data = _ran(make_sweep(n_prompts=4, shard_size=2), {"greedy": ["eager"]})
    assert "decode_step" not in summarize(data, n_boot=0).columns


def test_each_cell_names_its_step_from_the_results_and_from_the_store(tmp_path):
    data = _ran(make_sweep(n_prompts=4, shard_size=2), {"greedy": ["graphs"], "top_p": ["static", "graphs"]})
    store = FileStore(tmp_path)
    write_sweep(store, data)
    for source in (data, load_sweep(store, data.tenant, data.sweep_id)):
        summary = summarize(source, n_boot=0)
        steps = dict(zip(summary["strategy"], summary["decode_step"]))
        assert steps["greedy"] == "graphs" and steps["top_p"] == "mixed"
        assert all(steps[s] is None for s in steps if s not in ("greedy", "top_p"))
