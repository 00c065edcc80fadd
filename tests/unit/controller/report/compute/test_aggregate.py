"""Aggregation of synthetic sweeps: columns, reference row, CIs, sharding, speed, compare."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from controller.metrics import METRICS, Metric, additive_metric, cell_data, item_rows, metric, ratio
from controller.report.compute.aggregate import summarize
from controller.report.compute.columns import DESIGN_COLUMNS, QUALITY_COLUMNS, REFERENCE, SPEED_COLUMNS
from controller.report.compute.compare import compare
from controller.report.load.jobs import MIN_CI_PROMPTS
from controller.report.load.sweep import SweepData, load_sweep
from controller.report.render.format import metric_columns
from controller.report.stats.speed import speed_columns
from tests.support.report import make_sweep, registry, toy_metrics, write_sweep
from worker.core import paths
from worker.core.registry import Registry
from worker.core.results import BatchTiming
from worker.store import FileStore

pytestmark = pytest.mark.pure


def row(summary: pd.DataFrame, strategy: str) -> pd.Series:
    return summary[summary["strategy"] == strategy].iloc[0]


@pytest.fixture(scope="module")
def one_seed() -> pd.DataFrame:
    return summarize(make_sweep(), n_boot=100)


@pytest.fixture(scope="module")
def few_prompts() -> pd.DataFrame:
    return summarize(make_sweep(n_prompts=MIN_CI_PROMPTS - 1, seeds=(0, 1, 2)), n_boot=100)


@pytest.fixture(scope="module")
def three_seeds() -> pd.DataFrame:
    return summarize(make_sweep(seeds=(0, 1, 2), n_prompts=12), n_boot=300, n_boot_corpus=40)


def test_every_design_column_in_order_then_extras(one_seed):
    assert list(one_seed.columns[: len(DESIGN_COLUMNS)]) == DESIGN_COLUMNS
    extras = list(one_seed.columns[len(DESIGN_COLUMNS) :])
    assert {"decode_ms_per_token", "memory_kind", "cell", "nvml_peak_mb", "gpu_util_mean"} <= set(extras)
    assert list(one_seed["strategy"]) == ["greedy", "top_p", REFERENCE]
    top_p = row(one_seed, "top_p")
    assert top_p["params"] == '{"p":0.9,"temperature":1.0}'
    assert (top_p["n_prompts"], top_p["n_generations"], top_p["n_seeds"]) == (8, 8, 1)
    assert top_p["memory_kind"] == "rss" and top_p["peak_memory_mb"] == 500.0


def test_reference_row_has_reference_free_metrics_and_no_speed(one_seed):
    ref = row(one_seed, REFERENCE)
    assert ref["model"] is None and ref["n_generations"] == 8
    for col in SPEED_COLUMNS + ["bleu", "rouge_1", "rouge_l", "perplexity"]:
        assert math.isnan(ref[col]), col
    refs = cell_data({"text": p.reference} for p in make_sweep().prompts)
    for name in ("distinct_1", "mean_length", "self_bleu_4", "zipf"):
        assert ref[name] == pytest.approx(METRICS.get(name).fn(refs))


def test_no_reference_row_without_references():
    summary = summarize(make_sweep(with_references=False), n_boot=0)
    assert REFERENCE not in set(summary["strategy"])
    assert summary[["bleu", "rouge_1", "rouge_2", "rouge_l"]].isna().all().all()


def test_inapplicable_metric_is_empty_never_zero(tmp_path):
    def none_metric(cell):
        return None

    always_none = Metric(name="always_none", description="x", level="corpus", higher_is_better=None, fn=none_metric)
    metrics = registry([m for _, m in METRICS.items()] + [always_none])
    summary = summarize(make_sweep(with_nll=False, with_references=False), n_boot=0, metrics=metrics)
    assert summary["perplexity"].isna().all() and summary["always_none"].isna().all()
    assert summary["bleu"].isna().all()
    path = tmp_path / "s.csv"
    summary.to_csv(path, index=False)
    header, first = path.read_text().splitlines()[:2]
    cells = dict(zip(header.split(","), first.split(",")))
    assert cells["perplexity"] == "" and cells["always_none"] == ""


def test_ci_columns_wherever_each_cell_has_enough_prompts_one_seed_or_many(few_prompts, one_seed, three_seeds):
    """The prompt is the resampling unit: one seed (greedy against beam) gets intervals and comparisons
    like three; below MIN_CI_PROMPTS prompts a cell, none (issue 46: one seed had none before)."""
    assert not [c for c in few_prompts.columns if "_ci_" in c and not c.startswith("tokens_per_s")]  # speed: batches
    assert few_prompts.attrs["ci"] is None and "baseline" not in few_prompts.columns
    assert one_seed["n_seeds"].max() == 1 and one_seed.attrs["ci"]["unit"] == "prompt"
    greedy, top_p = (one_seed[one_seed["strategy"] == s].iloc[0] for s in ("greedy", "top_p"))
    for m in QUALITY_COLUMNS:
        assert f"{m}_ci_low" in one_seed.columns and f"{m}_diff_p_holm" in one_seed.columns
    assert greedy["mean_length_ci_low"] <= greedy["mean_length"] <= greedy["mean_length_ci_high"]
    assert top_p["baseline"] == greedy["cell"] and not math.isnan(top_p["mean_length_diff_p_holm"])
    for m in QUALITY_COLUMNS:
        assert f"{m}_ci_low" in three_seeds.columns and f"{m}_ci_high" in three_seeds.columns
    assert list(three_seeds.columns[: len(DESIGN_COLUMNS)]) == DESIGN_COLUMNS
    ci = three_seeds.attrs["ci"]
    assert ci["unit"] == "prompt" and ci["methods"]["rouge_1"] == "bootstrap"
    assert ci["methods"]["distinct_2"] == "jackknife"


def test_intervals_bracket_the_estimate(three_seeds):
    top_p = row(three_seeds, "top_p")
    assert top_p["n_seeds"] == 3 and top_p["n_generations"] == 36
    checked = 0
    for m in metric_columns(three_seeds):
        value, lo, hi = top_p[m], top_p.get(f"{m}_ci_low"), top_p.get(f"{m}_ci_high")
        if value is None or math.isnan(value):
            assert lo is None or math.isnan(lo)
            continue
        assert lo <= value + 1e-12 and value <= hi + 1e-12, (m, lo, value, hi)
        checked += 1
    assert checked >= 10
    assert top_p["mean_length_ci_high"] > top_p["mean_length_ci_low"]  # not degenerate


def test_intervals_are_reproducible():
    data = make_sweep(seeds=(0, 1), n_prompts=8)
    a = summarize(data, n_boot=50, n_boot_corpus=10, seed=3)
    b = summarize(data, n_boot=50, n_boot_corpus=10, seed=3)
    pd.testing.assert_frame_equal(a, b)


def test_one_shard_and_four_shards_give_identical_corpus_metrics():
    one = summarize(make_sweep(n_prompts=8, shard_size=8, seeds=(0, 1)), n_boot=100, n_boot_corpus=20)
    four = summarize(make_sweep(n_prompts=8, shard_size=2, seeds=(0, 1)), n_boot=100, n_boot_corpus=20)
    assert list(one["n_jobs"][:2]) == [1, 2]
    assert list(four["n_jobs"][:2]) == [4, 8]
    cols = [c for c in one.columns if c not in ("n_jobs", "peak_memory_mb")]  # synthetic RSS grows per shard
    pd.testing.assert_frame_equal(one[cols], four[cols])
    # A corpus metric is not the mean of per-shard values: recomputing per shard differs.
    data = make_sweep(n_prompts=8, shard_size=2, seeds=(0, 1))
    gens = [g for g in data.generations if g.strategy == "top_p"]
    distinct = METRICS.get("distinct_2").fn
    jobs = sorted({g.job_id for g in gens})
    per_shard = np.mean([distinct(cell_data([g for g in gens if g.job_id == j])) for j in jobs])
    assert row(four, "top_p")["distinct_2"] == pytest.approx(distinct(cell_data(gens)))
    assert row(four, "top_p")["distinct_2"] != pytest.approx(per_shard)


def test_toy_registry_is_enough():
    """The aggregation only uses the registry API: any registered metric becomes a column."""
    summary = summarize(make_sweep(seeds=(0, 1)), n_boot=50, n_boot_corpus=10, metrics=toy_metrics())
    assert list(summary.columns[: len(DESIGN_COLUMNS)]) == DESIGN_COLUMNS
    assert summary["rep_3"].isna().all()  # not registered: empty
    assert "eos_rate" in summary.columns and "eos_rate_ci_low" in summary.columns
    assert math.isnan(row(summary, REFERENCE)["eos_rate"]) or row(summary, REFERENCE)["eos_rate"] is None
    assert summary.attrs["ci"]["methods"] == {  # as each toy metric declares
        "mean_length": "bootstrap",
        "rep_2": "bootstrap",
        "perplexity": "bootstrap",
        "eos_rate": "bootstrap",
        "distinct_2": "jackknife",
        "bleu": "jackknife",
    }


def test_a_new_metric_gets_the_interval_it_declares():
    """The interval code knows no metric: one registered anywhere gets the method it declares."""
    metrics: Registry[Metric] = Registry("metric")

    @additive_metric(
        "long_share",
        combine=ratio,
        description="share of generations over 8 words",
        level="corpus",
        higher_is_better=None,
        registry=metrics,
    )
    def long_share(cell):
        return item_rows([(len(w) > 8, 1) for w in cell.words], 2)

    @metric("type_token", description="distinct words / words", level="corpus", higher_is_better=True, registry=metrics)
    def type_token(cell):
        words = [t for w in cell.words for t in w]
        return len(set(words)) / len(words) if words else None

    @metric(
        "first_length",
        description="words of the first generation",
        level="corpus",
        higher_is_better=None,
        interval="none",
        registry=metrics,
    )
    def first_length(cell):
        return float(len(cell.words[0])) if cell.words else None

    data = make_sweep(seeds=(0, 1, 2), n_prompts=30)
    summary = summarize(data, n_boot=1000, n_boot_corpus=20, metrics=metrics)
    assert summary.attrs["ci"]["methods"] == {"long_share": "bootstrap", "type_token": "jackknife"}
    for strategy in ("greedy", "top_p", REFERENCE):
        r = row(summary, strategy)
        assert r["long_share_ci_low"] <= r["long_share"] <= r["long_share_ci_high"]
        assert r["type_token_ci_low"] <= r["type_token"] <= r["type_token_ci_high"]
        assert not math.isnan(r["first_length"]) and math.isnan(r["first_length_ci_low"])
    top_p = row(summary, "top_p")
    assert top_p["type_token_ci_low"] < top_p["type_token_ci_high"]  # not degenerate
    # The bootstrap's width is that of a ratio estimate over prompts: 2 · 1.96 · SE, with
    # SE from the prompts' totals (all seeds of a prompt together).
    per_prompt: dict[str, list[bool]] = {}
    for g in data.generations:
        if g.strategy == "top_p":
            per_prompt.setdefault(g.prompt_id, []).append(len(cell_data([g]).words[0]) > 8)
    long = np.array([sum(v) for v in per_prompt.values()], dtype=float)
    n = np.array([len(v) for v in per_prompt.values()], dtype=float)
    share = long.sum() / n.sum()
    assert top_p["long_share"] == share
    se = math.sqrt(np.sum((long - share * n) ** 2) / (len(n) - 1) / len(n)) / n.mean()
    width = top_p["long_share_ci_high"] - top_p["long_share_ci_low"]
    assert 0.8 < width / (2 * 1.96 * se) < 1.25


def test_speed_merges_raw_batches_then_takes_percentiles():
    data = make_sweep(n_prompts=4, shard_size=2, batch_size=1, cells=[("m", "greedy", {})])
    r0, r1 = data.results

    def batch(n, new, prefill, total):
        return BatchTiming(
            n=n,
            batch_size=n,
            input_tokens=4,
            new_tokens=new,
            prefill_s=prefill,
            total_s=total,
            decode_s=total - prefill,
            steps=new // n,
        )

    r0.batches[:] = [batch(1, 10, 0.1, 1.0)]
    r1.batches[:] = [batch(3, 30, 0.2, 2.0), batch(1, 5, 0.4, 4.0)]
    speed = speed_columns([r0, r1])
    assert speed["tokens_per_s"] == pytest.approx(45 / 7.0)  # not the mean of per-job rates
    latencies = [1000.0] + [2000.0] * 3 + [4000.0]  # one value per generation
    assert speed["latency_ms_p50"] == pytest.approx(np.percentile(latencies, 50))
    assert speed["latency_ms_p95"] == pytest.approx(np.percentile(latencies, 95))
    assert speed["ttft_ms_p50"] == pytest.approx(200.0)
    # time per output token after the first: decode time over decoding steps (10-1, 10-1, 5-1)
    assert speed["decode_ms_per_token"] == pytest.approx((0.9 + 1.8 + 3.6) * 1000 / 22)
    r1.memory["torch_peak_mb"] = 123.0
    assert speed_columns([r0, r1])["peak_memory_mb"] == 123.0
    assert speed_columns([r0, r1])["memory_kind"] == "torch"


def test_speed_counts_every_sample_of_a_plain_batch_as_a_stream_does():
    """A job of 2 prompts of 3 samples streamed (6 generations, each its own latency) beside one run as a plain
    batch: the batch's 6 generations count 6 times, not once a prompt (the median was the stream's 1000 ms)."""
    data = make_sweep(n_prompts=4, shard_size=2, batch_size=2, cells=[("m", "top_p", {})])
    r0, r1 = data.results
    for r in (r0, r1):
        r.job = r.job.model_copy(update={"strategy": r.job.strategy.model_copy(update={"samples": 3})})
    stream = dict(n=2, batch_size=1, input_tokens=4, new_tokens=60, prefill_s=0.1, total_s=1.5, decode_s=1.4)
    r0.batches[:] = [BatchTiming(**stream, steps=20, latency_s=[1.0] * 6, ttft_s=[0.1] * 6, tpot_s=[0.01] * 6)]
    plain = dict(n=2, batch_size=2, input_tokens=4, new_tokens=60, prefill_s=0.3, total_s=3.0, decode_s=2.7)
    r1.batches[:] = [BatchTiming(**plain, steps=10)]
    speed = speed_columns([r0, r1])
    assert speed["latency_ms_p50"] == pytest.approx(np.percentile([1000.0] * 6 + [3000.0] * 6, 50))
    assert speed["ttft_ms_p50"] == pytest.approx(200.0)
    assert speed["decode_ms_per_token"] == pytest.approx((6 * 10.0 + 6 * 300.0) / 12)


def test_load_sweep_reads_complete_jobs_once(tmp_path):
    store = FileStore(tmp_path)
    data = make_sweep(n_prompts=4, shard_size=2)
    write_sweep(store, data)
    first = data.results[0].job.job_id
    key = paths.generations_key(data.tenant, data.sweep_id, first)
    store.write_bytes(key, store.read_bytes(key) * 2)  # a retried job appended its lines again
    store.write_jsonl(
        paths.generations_key(data.tenant, data.sweep_id, "incomplete000000"),
        [data.generations[0].model_copy(update={"job_id": "incomplete000000"}).model_dump()],
    )
    loaded = load_sweep(store, data.tenant, data.sweep_id)
    assert isinstance(loaded, SweepData) and loaded.spec == data.spec
    assert len(loaded.results) == len(data.results)
    assert len(loaded.generations) == len(data.generations)
    assert "incomplete000000" not in {g.job_id for g in loaded.generations}
    pd.testing.assert_frame_equal(summarize(loaded, n_boot=0), summarize(data, n_boot=0))


def test_compare_gives_per_cell_differences(one_seed):
    b = one_seed.copy()
    b.loc[b["strategy"] == "greedy", "tokens_per_s"] += 10.0
    extra = b.iloc[[0]].copy()
    extra["params"] = '{"other":1}'
    b = pd.concat([b, extra], ignore_index=True)
    out = compare(one_seed, b)
    greedy = out[(out["strategy"] == "greedy") & (out["present"] == "both")].iloc[0]
    assert greedy["tokens_per_s_delta"] == pytest.approx(10.0)
    assert greedy["distinct_2_delta"] == 0.0
    assert math.isnan(row(out, REFERENCE)["tokens_per_s_delta"])
    assert set(out["present"]) == {"both", "b"}
    assert "tokens_per_s_a" in out.columns and "tokens_per_s_b" in out.columns


def test_a_cell_whose_perplexity_is_past_the_floats_leaves_it_empty_and_the_report_whole():
    """One cell scored at a mean NLL of 800 nats a token: math.exp overflowed and the whole summary was lost."""
    data = make_sweep(seeds=(0, 1), n_prompts=8)
    lost = data.generations[0].cell
    for i, g in enumerate(data.generations):
        if g.cell == lost:
            data.generations[i] = g.model_copy(update={"nll_sum": 800.0 * g.nll_count})
    summary = summarize(data, n_boot=100, n_boot_corpus=10)
    cells = summary.set_index("cell")
    assert math.isnan(cells.loc[lost, "perplexity"]) and math.isnan(cells.loc[lost, "perplexity_ci_low"])
    others = summary[(summary["cell"] != lost) & summary["perplexity"].notna()]
    assert len(others) > 0 and others["perplexity_ci_low"].notna().all()
