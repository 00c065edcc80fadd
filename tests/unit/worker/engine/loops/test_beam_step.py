"""Beam search (and diverse beam search) as a step of the engine's own loop: a job is one stream of
batch_size prompts x num_beams rows; prompts whose search is over leave and the queue's next prompts take
their rows (continuous refill). Asserted: every prompt gets the hypotheses the same step gives it in plain
batches over transformers' own cache, the plan for models whose layers do not take the preallocated one
(which tests/unit/worker/engine/loops/test_beam.py holds to generate()'s beam search and to each prompt searched alone),
whatever the stream's slots, stops, lengths, groups, penalties, check intervals and KV span; no KV buffer
grows; each prompt's latency runs to the end of its search."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.engine import MIXED, POOL, CudaProbe, forbid_growth, forward_widths, job
from worker.engine import generate as engine
from worker.engine import plan as planning
from worker.engine.job import generate_job
from worker.engine.loops.beam_step import BeamStep
from worker.engine.plan import configure

pytestmark = pytest.mark.timeout(240)


def batch_loop(monkeypatch, spec, runtime):
    """The job in plain batches over transformers' own cache (the plan of a model whose layers do not take
    the preallocated cache): no refill, no prepared mask."""
    with monkeypatch.context() as patch:
        real = planning.probes
        patch.setattr(planning, "probes", lambda model: dataclasses.replace(real(model), preallocated=False))
        patch.setattr(planning, "prepared_mask", lambda model: False)
        return generate_job(spec, runtime)


def outputs(records):
    return [(r.token_ids, r.stop_reason, r.n_new_tokens) for r in records]


@pytest.mark.parametrize(
    "strategy,params",
    [
        ("beam", {"num_beams": 4}),
        ("beam", {"num_beams": 3, "length_penalty": 0.0, "early_stopping": True, "repetition_penalty": 1.3}),
        ("diverse_beam", {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.8}),
    ],
)
def test_a_beam_stream_refills_and_every_prompt_gets_the_batch_loops_search(
    small_model, runtime, monkeypatch, strategy, params
):
    spec = job(small_model, strategy, params, batch_size=3, max_new=20, stop=[","], prompts=[*MIXED, *POOL])
    with forbid_growth(tight=False):
        result, ours = generate_job(spec, runtime)
    (stream,) = result.batches
    assert stream.refills >= 3 and stream.compactions >= 3 and stream.batch_size == 3
    assert result.engine["decode_loop"].startswith("worker.engine.decode (beam search's step")
    assert {r.stop_reason for r in ours} >= {"stop_string"}
    theirs_result, theirs = batch_loop(monkeypatch, spec, runtime)
    assert theirs_result.engine["decode_loop"] == (
        "worker.engine.decode (beam search's step (worker.engine.loops.beam_step); finished rows dropped)"
    )
    assert theirs_result.engine["plan"]["cache"] == "dynamic"
    assert outputs(ours) == outputs(theirs)
    # a prompt's latency runs to the end of its search, which may come after its best hypothesis ended
    assert all(0 < t <= lat <= stream.total_s + 1e-6 for t, lat in zip(stream.ttft_s, stream.latency_s))


def test_a_prompt_whose_search_ends_at_its_first_step_never_joins_the_stream(small_model, runtime, monkeypatch):
    """max_new_tokens 1: every search is over after the prefill's step; no decode step runs."""
    from worker.core.contract import ModelSpec

    lm = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    spec = job(small_model, "beam", {"num_beams": 4}, batch_size=2, max_new=1, prompts=MIXED)
    result, ours, widths = forward_widths(lm, spec, runtime, monkeypatch)
    assert result.batches[0].refills >= 3 and 1 not in widths  # prefills only
    assert outputs(ours) == outputs(batch_loop(monkeypatch, spec, runtime)[1])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(POOL) - 1), min_size=2, max_size=7),
    slots=st.integers(1, 3),
    stop=st.sampled_from([[], ["."], [","]]),
    max_new=st.integers(1, 12),
    every=st.sampled_from([1, 8]),
    shape=st.sampled_from(
        [
            ("beam", {"num_beams": 2}),
            ("beam", {"num_beams": 4, "length_penalty": 2.0}),
            ("beam", {"num_beams": 3, "early_stopping": True, "no_repeat_ngram_size": 2}),
            ("diverse_beam", {"num_beams": 4, "num_beam_groups": 2}),
            ("diverse_beam", {"num_beams": 6, "num_beam_groups": 3, "diversity_penalty": 1.5}),
        ]
    ),
    tight=st.booleans(),
)
def test_any_beam_stream_gives_every_prompt_the_batch_loops_search(
    small_model, runtime, monkeypatch, picks, slots, stop, max_new, every, shape, tight
):
    """Random prompt mixes, slots, stops, lengths, check intervals (8: CUDA's), beams, groups, penalties and
    KV spans (tight: the window slides whenever it can): the stream gives every prompt the batch loop's
    hypotheses, and no KV buffer grows."""
    monkeypatch.setattr(engine, "check_every", lambda device: every)
    strategy, params = shape
    prompts = [POOL[i] for i in picks]
    spec = job(small_model, strategy, params, batch_size=slots, max_new=max_new, stop=stop, prompts=prompts)
    with forbid_growth(tight):
        _, ours = generate_job(spec, runtime)
    assert outputs(ours) == outputs(batch_loop(monkeypatch, spec, runtime)[1])


def test_the_cuda_probe_plans_num_beams_cache_rows_per_prompt_for_the_beam_step(tiny_model, runtime, monkeypatch):
    from worker.core.contract import ModelSpec

    cuda = CudaProbe(runtime, monkeypatch)
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    spec = job(tiny_model, "beam", {"num_beams": 3}, max_new=8)
    decoding = configure(lm, spec.strategy, spec.generation)
    assert decoding.step is BeamStep and decoding.refill
    cuda.probe(lm, decoding, spec)
    rows = [each for _, each in cuda.asked]
    assert rows == [3] and cuda.peaks[0] is not None  # beams' rows, the prompt prefilled into their buffers
