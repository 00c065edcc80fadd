"""Continuous refill: a job as one stream of batch_size rows, freed rows taking the next prompts.

What is asserted is what makes the speed honest: every generation of a stream is token for
token its unbatched run (greedy) or its own seed's sample, whichever rows it shared the
stream with; each generation's own latency and time to first token are recorded and used by
the report; `refill: false` and configurations the stream cannot reproduce run batch after
batch; a CUDA out-of-memory error halves the stream's rows.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.report.stats.speed import speed_columns
from tests.support.engine import (
    MIXED,
    POOL,
    forbid_growth,
    forward_widths,
    job,
    small_config,
    unbatched_greedy,
    with_generation,
)
from worker.core.contract import ModelSpec
from worker.engine import generate as engine
from worker.engine.job import generate_job
from worker.engine.plan import configure

pytestmark = pytest.mark.timeout(180)


def test_a_greedy_stream_refills_free_rows_and_every_row_is_its_unbatched_run(small_model, runtime):
    tiny_model = small_model  # austen-small: the tiny model's greedy choices hide some misalignments
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    spec = job(tiny_model, "greedy", batch_size=3, max_new=30, stop=[","], prompts=MIXED)
    result, records = generate_job(spec, runtime)
    (stream,) = result.batches
    assert stream.n == len(MIXED) and stream.batch_size == 3 and stream.refills >= 2 and stream.compactions >= 2
    assert result.engine["refills"] == stream.refills and "refilled" in result.engine["decode_loop"]
    assert [r.prompt_id for r in records] == [f"p{i}" for i in range(len(MIXED))]
    assert {r.stop_reason for r in records} >= {"stop_string"}
    for prompt, rec in zip(MIXED, records):
        assert rec.token_ids == unbatched_greedy(lm, prompt, 30)[: rec.n_new_tokens], prompt


def test_newcomers_longer_than_the_batch_so_far_are_aligned(small_model, runtime, monkeypatch):
    """Prompts shortest first, so rows that join are longer than the running batch's columns."""
    from worker.engine.rows import Rows

    merges = []
    real_merge = Rows.merge

    def merge(self, other, *args):
        merges.append((self.width, other.width))
        return real_merge(self, other, *args)

    monkeypatch.setattr(Rows, "merge", merge)
    lm = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    spec = job(small_model, "greedy", batch_size=2, max_new=12, stop=[","], prompts=["Anne", "Emma", *MIXED])
    decoding = configure(lm, spec.strategy, spec.generation)
    prompts = sorted(spec.prompts, key=lambda p: len(lm.tokenizer(p.prompt)["input_ids"]))
    raw = engine.run_batch(lm, decoding, prompts, [0] * len(prompts), slots=2)
    out = engine.finish_batch(lm.tokenizer, decoding, raw)
    assert raw.refills >= 3 and any(theirs > mine for mine, theirs in merges), merges
    for p, ids in zip(prompts, out.token_ids):
        assert ids == unbatched_greedy(lm, p.prompt, 12)[: len(ids)], p.prompt


def test_seeded_samples_of_a_stream_are_their_own_seeds_samples(tiny_model, runtime):
    def run(batch_size: int, refill: bool = True):
        spec = job(tiny_model, "top_k", {"k": 20}, seed=5, batch_size=batch_size, max_new=24, stop=["."], prompts=MIXED)
        return generate_job(with_generation(spec, refill=refill), runtime)

    streamed, records = run(3)
    assert streamed.batches[0].refills >= 1
    for other in (run(1)[1], run(3, refill=False)[1], run(len(MIXED))[1]):
        assert [r.token_ids for r in other] == [r.token_ids for r in records]


def test_each_generation_records_its_own_latency_and_the_report_uses_it(tiny_model, runtime):
    spec = job(tiny_model, "greedy", batch_size=2, max_new=20, stop=[","], prompts=MIXED)
    result, _ = generate_job(spec, runtime)
    (stream,) = result.batches
    assert len(stream.latency_s) == len(stream.ttft_s) == len(MIXED)
    assert all(0 < t <= lat <= stream.total_s + 1e-6 for t, lat in zip(stream.ttft_s, stream.latency_s))
    assert len(set(stream.latency_s)) > 1  # rows end at their own times, not the batch's
    speed = speed_columns([result])
    latencies = sorted(x * 1000.0 for x in stream.latency_s)
    assert min(latencies) <= speed["latency_ms_p50"] <= max(latencies)
    assert speed["latency_ms_p50"] < stream.total_s * 1000.0


def test_a_rows_finish_is_the_step_that_picked_its_last_token_though_the_loop_looks_every_8(
    small_model, runtime, monkeypatch
):
    """As on CUDA: finished rows are found at every 8th step, yet each generation's latency and TPOT are its own."""
    from worker.engine import decode

    monkeypatch.setattr(engine, "check_every", lambda device: 8)
    stamps = {}
    real_seconds = decode.Timeline.seconds

    def seconds(self, times, n_new, max_new):
        stamps.update(step_s=times.step_s, marks=times.marks, n_new=n_new, second=self.second, start=self.start)
        return real_seconds(self, times, n_new, max_new)

    monkeypatch.setattr(decode.Timeline, "seconds", seconds)
    spec = job(small_model, "greedy", batch_size=3, max_new=30, stop=[","], prompts=MIXED)
    result, records = generate_job(spec, runtime)
    (stream,) = result.batches
    assert stream.refills >= 1
    n = [k if k > 0 else 30 for k in stamps["n_new"]]  # tokens each row was given, in the stream's order
    assert sorted(n) == sorted(len(r.token_ids) + (r.stop_reason == "eos") for r in records)
    firsts = [i for i, s in enumerate(stamps["second"]) if s == 1]  # the rows of the first prefill
    by_n = {}
    for i in firsts:
        by_n.setdefault(n[i], set()).add(stream.latency_s[i])
    assert len(by_n) >= 2 and all(len(v) == 1 for v in by_n.values())  # same start: latency is a function of n
    ordered = [min(v) for _, v in sorted(by_n.items())]
    assert ordered == sorted(ordered) and len(set(ordered)) == len(ordered)  # more tokens, later finish
    for i in range(len(n)):
        end = stamps["step_s"][stamps["second"][i] + n[i] - 2] if n[i] > 1 else None
        if end is not None:  # the stamp of the step that picked the row's last token
            assert stream.latency_s[i] == pytest.approx(end - stamps["marks"][stamps["start"][i]], abs=2e-6)
            tpot = (stream.latency_s[i] - stream.ttft_s[i]) / (n[i] - 1)
            assert stream.tpot_s[i] == pytest.approx(tpot, abs=2e-6)
        else:
            assert stream.tpot_s[i] is None
    speed = speed_columns([result])
    tpots = [t for t in stream.tpot_s if t is not None]
    assert speed["decode_ms_per_token"] == pytest.approx(1000 * sum(tpots) / len(tpots))


def test_refill_false_runs_batch_after_batch_and_penalties_stream_like_the_rest(tiny_model, runtime):
    spec = job(tiny_model, "greedy", batch_size=3, max_new=8, prompts=MIXED)
    off, _ = generate_job(with_generation(spec, refill=False), runtime)
    assert len(off.batches) == 3 and all(b.refills is None and b.latency_s is None for b in off.batches)
    assert off.engine["refills"] is None and "refilled" not in off.engine["decode_loop"]
    penalised = job(tiny_model, "greedy", {"repetition_penalty": 1.3}, batch_size=3, max_new=8, prompts=MIXED)
    at_least = with_generation(spec, min_new_tokens=4)  # penalties and minimum lengths apply row by row
    for other in (penalised, at_least):
        result, _ = generate_job(other, runtime)
        (stream,) = result.batches
        assert stream.refills >= 1 and "refilled" in result.engine["decode_loop"]


def test_cuda_out_of_memory_halves_the_streams_rows(tiny_model, runtime, monkeypatch):
    calls = []
    real = engine.run_batch

    def flaky(lm, decoding, prompts, seeds, slots=None):
        calls.append((len(prompts), slots))
        if slots is not None and slots > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated with more than 1 row)")
        return real(lm, decoding, prompts, seeds, slots)

    monkeypatch.setattr(engine, "run_batch", flaky)
    result, records = generate_job(job(tiny_model, "greedy", batch_size=4, max_new=6, prompts=MIXED), runtime)
    assert calls == [(len(MIXED), 4), (len(MIXED), 2), (len(MIXED), 1)] and len(records) == len(MIXED)
    assert any("the stream retried with 2" in n for n in result.notes)
    assert result.batches[0].batch_size == 1


def test_a_model_with_sliding_window_layers_runs_batch_after_batch(tiny_model, runtime, tmp_path):
    """Refill needs the preallocated cache; a sliding-window model keeps transformers' cache and plain batches."""
    from transformers import AutoTokenizer, MistralForCausalLM

    from tests.support.engine import sliding_window_config

    torch.manual_seed(0)
    config = sliding_window_config(vocab_size=4096)
    MistralForCausalLM(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path)
    result, records = generate_job(job(str(tmp_path), "greedy", batch_size=2, max_new=4, prompts=MIXED[:4]), runtime)
    assert len(result.batches) == 2 and result.engine["refills"] is None and len(records) == 4
    assert result.engine["decode_loop"].startswith("worker.engine.decode") and result.engine["kv_cache"] == "dynamic"
    assert result.engine["decode_mask"] is None  # its layers need transformers' sliding-window mask


def test_a_stream_allocates_its_kv_buffers_once_and_slides_within_them(small_model, runtime, monkeypatch):
    """One pair of buffers per layer for the stream's slots and decode.stream_span columns: newcomers are
    written into them, the columns finished rows free are reclaimed by sliding the window to the front,
    nothing grows (the old layout needed the longest prompt plus twice max_new); rows are still their
    unbatched runs."""
    from worker.engine import decode, kvcache

    allocated = []
    real_init = kvcache.PreallocatedLayer.lazy_initialization

    def init(self, keys, values):
        real_init(self, keys, values)
        allocated.append(tuple(self._k.shape))

    monkeypatch.setattr(kvcache.PreallocatedLayer, "lazy_initialization", init)
    lm = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    layers, prompts = lm.model.config.n_layer, [*MIXED, *POOL]
    spec = job(small_model, "greedy", batch_size=3, max_new=30, stop=[","], prompts=prompts)
    with forbid_growth(tight=False) as slides:
        result, records = generate_job(spec, runtime)
    (stream,) = result.batches
    longest = max(len(lm.tokenizer(p)["input_ids"]) for p in prompts)
    span = decode.stream_span(longest, 30, 1)
    assert span < longest + 2 * 30 and stream.refills >= 4 and sum(slides) >= 1
    heads, dim = lm.model.config.n_head, lm.model.config.n_embd // lm.model.config.n_head
    assert allocated.count((3, heads, span, dim)) == layers  # the stream's, once
    assert all(shape[2] <= longest for shape in allocated if shape[2] != span)  # the rest: newcomers' prompts
    for prompt, rec in zip(prompts, records):
        assert rec.token_ids == unbatched_greedy(lm, prompt, 30)[: rec.n_new_tokens], prompt


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(POOL) - 1), min_size=3, max_size=9),
    slots=st.integers(1, 4),
    stop=st.sampled_from([[], ["."], [","], [" the"]]),
    max_new=st.integers(1, 14),
    every=st.sampled_from([1, 8]),
    modifiers=st.sampled_from([{}, {"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2}]),
    min_new=st.integers(0, 3),
    tight=st.booleans(),
)
def test_any_stream_samples_what_each_seed_samples_alone(
    tiny_model, runtime, monkeypatch, picks, slots, stop, max_new, every, modifiers, min_new, tight
):
    """Random prompt mixes, slot counts, stops, lengths, check intervals, penalties and KV spans (tight: the
    window slides whenever it can): a stream equals every prompt alone, and no KV buffer grows."""
    monkeypatch.setattr(engine, "check_every", lambda device: every)
    prompts = [POOL[i] for i in picks]
    params = {"k": 30, **modifiers}
    spec = job(tiny_model, "top_k", params, seed=7, batch_size=slots, max_new=max_new, stop=stop, prompts=prompts)
    spec = with_generation(spec, min_new_tokens=min(min_new, max_new))
    with forbid_growth(tight):
        _, streamed = generate_job(spec, runtime)
    _, alone = generate_job(with_generation(spec, batch_size=1, refill=False), runtime)
    assert [r.token_ids for r in streamed] == [r.token_ids for r in alone]
    assert [r.stop_reason for r in streamed] == [r.stop_reason for r in alone]


@pytest.fixture(scope="module")
def random_llama(tiny_model, tmp_path_factory):
    """A 2-layer random-weight Llama over the bundled tokenizer: grouped-query attention, rotary positions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("llama")
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(small_config("llama")).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(path)
    return str(path)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(POOL) - 1), min_size=3, max_size=9),
    slots=st.integers(1, 4),
    stop=st.sampled_from([[], ["."], [","], ["e"]]),
    max_new=st.integers(1, 14),
    family=st.sampled_from(["austen", "llama"]),
    every=st.sampled_from([1, 8]),
    tight=st.booleans(),
)
def test_any_greedy_stream_is_every_prompts_unbatched_generate(
    small_model, random_llama, runtime, monkeypatch, picks, slots, stop, max_new, family, every, tight
):
    """Random prompt mixes, slots, stops, lengths, check intervals (8: CUDA's) and KV spans on two families:
    each row is transformers' unbatched run, its timings ordered (TTFT <= latency <= wall time; TPOT after a
    second token), and no KV buffer grows."""
    monkeypatch.setattr(engine, "check_every", lambda device: every)
    model = small_model if family == "austen" else random_llama
    lm = runtime.cache.get(ModelSpec(path=model), runtime.device)
    prompts = [POOL[i] for i in picks]
    spec = job(model, "greedy", batch_size=slots, max_new=max_new, stop=stop, prompts=prompts)
    with forbid_growth(tight):
        result, streamed = generate_job(spec, runtime)
    for prompt, rec in zip(prompts, streamed):
        assert rec.token_ids == unbatched_greedy(lm, prompt, max_new)[: rec.n_new_tokens], prompt
    _, alone = generate_job(with_generation(spec, batch_size=1, refill=False), runtime)
    assert [(r.token_ids, r.stop_reason) for r in streamed] == [(r.token_ids, r.stop_reason) for r in alone]
    for b in result.batches:
        if b.latency_s is not None:
            assert all(0 < t <= lat <= b.total_s + 1e-6 for t, lat in zip(b.ttft_s, b.latency_s))
            assert all(x is None or x > 0 for x in b.tpot_s)


def test_compaction_keeps_a_sliding_window_models_cache_whole(tiny_model, runtime, tmp_path):
    """Only the preallocated cache drops leading columns: a sliding-window layer's columns are not the ids'."""
    from transformers import AutoTokenizer, MistralForCausalLM

    from tests.support.engine import sliding_window_config

    torch.manual_seed(1)
    MistralForCausalLM(sliding_window_config(vocab_size=4096)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path)
    prompts = ["Anne", *MIXED[1:4]]  # one short prompt: its row's padding is what a trim would drop
    spec = job(str(tmp_path), "greedy", batch_size=len(prompts), max_new=10, stop=["e"], prompts=prompts)
    result, batched = generate_job(spec, runtime)
    assert result.batches[0].compactions >= 1
    _, alone = generate_job(with_generation(spec, batch_size=1), runtime)
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]


def test_generations_that_end_at_their_first_token_never_take_a_decode_step(tiny_model, runtime, monkeypatch):
    """max_new_tokens 1 in a stream that looks every 8 steps, as on CUDA: a look right after the first token
    drops the first rows, and newcomers that end at once are not merged, so no decode step runs at all."""
    monkeypatch.setattr(engine, "check_every", lambda device: 8)
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    spec = job(tiny_model, "greedy", batch_size=3, max_new=1, prompts=MIXED)
    result, records, widths = forward_widths(lm, spec, runtime, monkeypatch)
    assert result.batches[0].refills == 2 and len(widths) == 3  # three prefills, no decode step
    _, alone = generate_job(with_generation(spec, batch_size=1, refill=False), runtime)
    assert [(r.token_ids, r.stop_reason) for r in records] == [(r.token_ids, r.stop_reason) for r in alone]
