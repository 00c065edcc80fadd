"""Speed with its spread: tokens/s intervals over batches, per-batch ranges, error bars, the unresolved note."""

from __future__ import annotations

import numpy as np
import pytest

from controller.report.compute.aggregate import summarize
from controller.report.render.format import summary_markdown
from controller.report.render.html import quality_speed_figure
from controller.report.stats.speed import batch_units, rate_interval, speed_ranges, unresolved_speed, untested_note
from tests.support.intervals import bootstrap_t
from tests.support.report import make_sweep


def speed_spread(results, *, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """A cell's speed spread as the report's row holds it: its ranges, and the map's tokens/s interval
    over its results' batches."""
    return speed_ranges(results) | rate_interval(batch_units(results), results[0].job.cell, n_boot=n_boot, seed=seed)


def test_spread_columns_equal_numpy_over_the_batches():
    data = make_sweep(seeds=(0, 1, 2), n_prompts=16, batch_size=2)
    results = [r for r in data.results if r.job.strategy.name == "top_p"]
    batches = [b for r in results for b in r.batches]
    spread = speed_spread(results, n_boot=2000)
    rates = np.array([b.new_tokens / b.total_s for b in batches])
    assert spread["tokens_per_s_batch_min"] == rates.min() and spread["tokens_per_s_batch_max"] == rates.max()
    lat = np.array([1000 * np.median(b.latency_s or [b.total_s]) for b in batches])
    assert spread["latency_ms_batch_min"] == pytest.approx(lat.min())
    assert spread["latency_ms_batch_max"] == pytest.approx(lat.max())
    units = np.array([[b.new_tokens, b.total_s] for b in batches], dtype=float)
    theta = units[:, 0].sum() / units[:, 1].sum()
    lo, hi = bootstrap_t(units, theta)
    width = hi - lo
    assert abs(spread["tokens_per_s_ci_low"] - lo) < 0.1 * width
    assert abs(spread["tokens_per_s_ci_high"] - hi) < 0.1 * width


def test_the_interval_does_not_depend_on_the_order_the_results_come_in():
    """A report from the store (listed) and from a sweep in memory (as run) gave 94.17 and 93.52 for one
    cell's upper bound: the bootstrap drew batch indices over the results in the order they came."""
    data = make_sweep(seeds=(0, 1, 2), n_prompts=16, batch_size=2)
    results = [r for r in data.results if r.job.strategy.name == "top_p"]
    assert len(results) > 1
    assert speed_spread(results, n_boot=500) == speed_spread(results[::-1], n_boot=500)


def test_overlapping_speed_intervals_are_named_and_drawn_as_error_bars():
    assert unresolved_speed([("a", 10, 8, 12), ("b", 11, 10.5, 11.5), ("c", 30, 29, 31)]) == [("a", "b")]
    data = make_sweep(seeds=(0, 1), n_prompts=8, batch_size=2)
    summary = summarize(data, n_boot=200)
    cells = summary["strategy"] != "reference"
    summary.loc[cells, "tokens_per_s_ci_low"] = summary.loc[cells, "tokens_per_s"].min() * 0.5
    summary.loc[cells, "tokens_per_s_ci_high"] = summary.loc[cells, "tokens_per_s"].max() * 2
    assert "Speed ordering not resolved" in summary_markdown(summary, data)
    scatter = quality_speed_figure(summary)["data"][0]
    x = np.array(scatter["x"])
    assert np.allclose(np.array(scatter["error_x"]["array"]), x * 0 + summary.loc[cells, "tokens_per_s"].max() * 2 - x)


def test_cells_without_a_speed_interval_are_named_not_passed_over():
    """By default a job of several batches is one continuous-refill stream, one unit of the tokens/s interval: a
    sweep of one seed and one shard had no interval in any cell, and the report said nothing of the cells' speed
    ordering (the unresolved note leaves cells without an interval out), as if it were resolved."""
    data = make_sweep(seeds=(0,), n_prompts=8, batch_size=8)
    summary = summarize(data, n_boot=200)
    cells = summary[summary["strategy"] != "reference"]
    assert len(cells) >= 2 and cells["tokens_per_s_ci_low"].isna().all()
    note = summary_markdown(summary, data)
    assert "Speed ordering untested for" in note and "Speed ordering not resolved" not in note
    from controller.report.render.html import speed_note

    assert speed_note(summary).startswith("Speed ordering untested for")
    assert speed_note(summary.iloc[:1]) == ""  # one cell timed: no ordering to test
    resolved = [("a", 10.0, 9.0, 11.0), ("b", 20.0, 19.0, 21.0), ("ref", float("nan"), float("nan"), float("nan"))]
    assert untested_note(resolved) == ""
    assert untested_note([*resolved, ("c", 30.0, float("nan"), float("nan"))]).startswith(
        "Speed ordering untested for c:"
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_the_reports_interval_is_computed_by_the_map_and_equals_the_cells_own(tmp_path, workers):
    """The controller plans each cell with its batches' units, no bootstrap; the map (in process, in a
    pool, from the cache) gives the interval speed_spread gives over the cell's results."""
    from controller.metrics import METRICS
    from controller.report.api import build
    from controller.report.compute.aggregate import cell_tasks
    from controller.report.load.sweep import load_sweep
    from tests.support.report import write_with_hashes
    from worker.store import FileStore

    data = make_sweep(seeds=(0, 1, 2), n_prompts=8, batch_size=2)
    store = FileStore(tmp_path)
    write_with_hashes(store, data)
    loaded = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    _, _, tasks = cell_tasks(loaded, 300, 0, 50, METRICS, store)
    assert all(np.isnan(t.row["tokens_per_s_ci_low"]) for t in tasks)  # the plan holds no interval
    for _ in range(2):  # computed, then from the cache
        _, summary = build(store, data.tenant, data.sweep_id, n_boot=300, workers=workers)
        for cell in {r.job.cell for r in data.results}:
            want = speed_spread([r for r in data.results if r.job.cell == cell], n_boot=300)
            row = summary[summary["cell"] == cell].iloc[0]
            assert (row["tokens_per_s_ci_low"], row["tokens_per_s_ci_high"]) == pytest.approx(
                (want["tokens_per_s_ci_low"], want["tokens_per_s_ci_high"]), rel=1e-12
            )


@pytest.mark.parametrize("batches", [[[768, 0.1268], [768, 0.1190]], [[768, 0.1268], [768, 0.1190], [700, 0.1201]]])
def test_two_or_three_batches_get_students_t_not_their_range(batches):
    """With two batches half the bootstrap's replicates draw one batch twice, so its percentiles were the two
    batches' rates (a "95%" interval that covered 50% of the time); three, 73%. Student's t(G − 1) of the ratio."""
    from scipy import stats as sps

    units = np.array(batches, dtype=float)
    out = rate_interval(batches, "c", n_boot=1000, seed=0)
    rate = units[:, 0].sum() / units[:, 1].sum()
    d = (units[:, 0] - rate * units[:, 1]) / units[:, 1].sum()  # the ratio's linearised values
    half = sps.t.ppf(0.975, len(units) - 1) * np.sqrt(len(units) * d.var(ddof=1))
    assert out["tokens_per_s_ci_low"] == pytest.approx(max(0.0, rate - half))
    assert out["tokens_per_s_ci_high"] == pytest.approx(rate + half)
    assert out["tokens_per_s_ci_high"] > (units[:, 0] / units[:, 1]).max()
