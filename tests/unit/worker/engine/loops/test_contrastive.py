"""Contrastive search, a step of the engine's own loop: finished rows leave the candidate pass, and a row's
candidates run over the row's own cache (k tokens, a diagonal mask) where the model takes the prepared mask,
choosing what the original repeated-cache candidates choose; there it runs with continuous refill, and a
stream chooses what each prompt alone chooses. (The paper's cache-free check is in test_engine.)"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.engine import MIXED, POOL, CudaProbe, forbid_growth, job, small_config, with_generation
from worker.core.contract import ModelSpec
from worker.engine import plan as planning
from worker.engine.job import generate_job
from worker.engine.models import MASK_PASSTHROUGH
from worker.engine.plan import configure


def test_contrastive_search_drops_finished_rows_from_its_candidate_pass(small_model, runtime, monkeypatch):
    """Rows that end (a stop string) leave the k-candidate forward; every row is still its unbatched run."""
    import functools

    from worker.engine.models import prepared_mask

    lm = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    prepared_mask(lm.model)  # the once-per-model mask check, before forward passes are counted
    rows_seen = []
    real_forward = lm.model.forward

    @functools.wraps(real_forward)
    def forward(*args, **kwargs):
        rows_seen.append(kwargs["input_ids"].numel())  # candidate tokens: live rows x k (either path)
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", forward)

    def contrastive(prompts, batch_size):
        params = {"k": 4, "alpha": 0.6}
        spec = job(small_model, "contrastive", params, batch_size, max_new=16, stop=[","], prompts=prompts)
        spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"warmup": False})})
        return generate_job(spec, runtime)[1]

    batched = contrastive(MIXED, len(MIXED))
    candidate_rows = rows_seen[1:]  # after the prefill: live rows x k candidate tokens
    assert candidate_rows[0] == 4 * len(MIXED) and min(candidate_rows) < candidate_rows[0]
    assert {r.stop_reason for r in batched} >= {"stop_string"}
    alone = [contrastive([p], 1)[0] for p in MIXED]
    assert [(r.token_ids, r.stop_reason) for r in batched] == [(r.token_ids, r.stop_reason) for r in alone]


@pytest.mark.parametrize("family", ["austen", *sorted(MASK_PASSTHROUGH)])
def test_contrastive_candidates_as_tokens_of_their_row_choose_what_repeated_caches_choose(
    family, small_model, tiny_model, runtime, tmp_path, monkeypatch
):
    """Contrastive search's shared-cache step (k candidates as k tokens of the row, a diagonal mask, no
    cache copies) against the repeated-cache step of the original implementation: the same tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.engine.loops import contrastive

    model = small_model
    if family != "austen":
        torch.manual_seed(4)
        AutoModelForCausalLM.from_config(small_config(family)).save_pretrained(tmp_path)
        AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path)
        model = str(tmp_path)
    steps = []
    for name in ("_shared", "_repeated"):
        real = getattr(contrastive, name)
        monkeypatch.setattr(contrastive, name, lambda *a, real=real, name=name: steps.append(name) or real(*a))
    spec = job(model, "contrastive", {"k": 4, "alpha": 0.6}, batch_size=4, max_new=12, stop=[","], prompts=MIXED)
    _, shared = generate_job(spec, runtime)
    assert steps and set(steps) == {"_shared"}  # candidates ran as 4 tokens of their row
    monkeypatch.setattr(planning, "prepared_mask", lambda model: False)
    steps.clear()
    _, repeated = generate_job(spec, runtime)
    assert steps and set(steps) == {"_repeated"}  # one token per row, the cache repeated 4 times
    assert [(r.token_ids, r.stop_reason) for r in shared] == [(r.token_ids, r.stop_reason) for r in repeated]


def test_looking_for_finished_rows_every_8_steps_as_on_cuda_changes_no_output(small_model, runtime, monkeypatch):
    """On CUDA the loop looks for finished rows every 8 steps (a look is a host synchronisation): rows leave
    the candidate pass only then, and every generation is what looking every step gives."""
    import functools

    from worker.engine import generate as engine
    from worker.engine.models import prepared_mask

    lm = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    prepared_mask(lm.model)
    spec = job(small_model, "contrastive", {"k": 4, "alpha": 0.6}, len(MIXED), max_new=20, stop=[","], prompts=MIXED)
    _, every_step = generate_job(spec, runtime)
    tokens = []
    real_forward = lm.model.forward

    @functools.wraps(real_forward)
    def forward(*args, **kwargs):
        tokens.append(kwargs["input_ids"].numel())
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", forward)
    monkeypatch.setattr(engine, "check_every", lambda device: 8)
    _, every_8 = generate_job(spec, runtime)
    passes = tokens[1:]  # after the prefill: the candidate passes, one per step
    changes = [i for i in range(1, len(passes)) if passes[i] != passes[i - 1]]
    assert changes and all(i % 8 == 0 or i == 1 for i in changes), passes  # the checks: after tokens 1, 8, 16...
    assert [(r.token_ids, r.stop_reason, r.n_new_tokens) for r in every_8] == [
        (r.token_ids, r.stop_reason, r.n_new_tokens) for r in every_step
    ]


def test_the_loop_benchmark_runs_both_steps_and_checks_their_outputs_identical():
    """benchmarks/bench_loops.py at a smoke size: every set's sides, each with identical outputs."""
    import subprocess
    import sys

    args = ["--prompts", "4", "--new", "4", "--rounds", "1"]
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_loops.py", *args], capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-2000:]
    sets = [line for line in run.stdout.splitlines() if line.startswith(("contrastive", "beam"))]
    assert len(sets) == 10 and all(line.endswith("identical 4/4") for line in sets), run.stdout
    assert all("refill_vs_batches x" in line for line in sets)
    assert sum("shared_vs_repeated x" in line for line in sets) == 4
    assert sum("preallocated_vs_dynamic x" in line for line in sets) == 6


def test_contrastive_search_runs_in_the_own_loop_with_refill_and_chooses_what_the_repeated_cache_chooses(
    small_model, runtime, monkeypatch
):
    """Where its candidates share their row's cache, contrastive search is a step of the engine's own loop
    with continuous refill over the preallocated cache: a stream of 3 rows over 10 prompts gives each prompt
    what the step gives it in batches over transformers' cache repeated k times (the plan where the prepared
    mask is refused), penalties included, and the result says which loop and cache ran."""
    params = {"k": 4, "alpha": 0.6, "repetition_penalty": 1.2}
    spec = job(small_model, "contrastive", params, batch_size=3, max_new=16, stop=[","], prompts=MIXED)
    result, own = generate_job(spec, runtime)
    (stream,) = result.batches
    assert stream.refills >= 2 and stream.compactions >= 2 and len(stream.latency_s) == len(MIXED)
    assert result.engine["decode_loop"].startswith("worker.engine.decode (contrastive search's step")
    assert "per row" in result.engine["modifiers"]
    monkeypatch.setattr(planning, "prepared_mask", lambda model: False)
    result, theirs = generate_job(spec, runtime)
    assert result.engine["decode_loop"] == (
        "worker.engine.decode (contrastive search's step (worker.engine.loops.contrastive); finished rows dropped)"
    )
    assert result.engine["plan"]["cache"] == "dynamic" and result.engine["plan"]["rows_per_prompt"] == 4
    assert [(r.token_ids, r.stop_reason) for r in own] == [(r.token_ids, r.stop_reason) for r in theirs]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.lists(st.integers(0, len(POOL) - 1), min_size=3, max_size=8),
    slots=st.integers(1, 4),
    stop=st.sampled_from([[], ["."], [","]]),
    max_new=st.integers(1, 12),
    every=st.sampled_from([1, 8]),
    k=st.integers(1, 5),
    tight=st.booleans(),
)
def test_any_contrastive_stream_is_every_prompt_alone(
    small_model, runtime, monkeypatch, picks, slots, stop, max_new, every, k, tight
):
    """Random prompt mixes, slots, stops, lengths, check intervals (8: CUDA's), candidate counts and KV spans
    (tight: the window slides whenever it can): each generation of a contrastive stream is its run alone,
    and no KV buffer grows (the stream's buffers hold the k candidate columns too)."""
    from worker.engine import generate as engine

    monkeypatch.setattr(engine, "check_every", lambda device: every)
    prompts = [POOL[i] for i in picks]
    params = {"k": k, "alpha": 0.6}
    spec = job(small_model, "contrastive", params, batch_size=slots, max_new=max_new, stop=stop, prompts=prompts)
    with forbid_growth(tight):
        _, streamed = generate_job(spec, runtime)
        _, alone = generate_job(with_generation(spec, batch_size=1, refill=False), runtime)
    assert [(r.token_ids, r.stop_reason) for r in streamed] == [(r.token_ids, r.stop_reason) for r in alone]


def test_the_cuda_probe_plans_one_cache_row_per_prompt_for_the_own_loops_contrastive_step(
    tiny_model, runtime, monkeypatch
):
    """The own loop's candidates are k tokens of their row, not k rows: the probe fits batch x 1 rows (where
    the mask is refused, the candidates repeat transformers' cache k times: batch x k)."""
    cuda = CudaProbe(runtime, monkeypatch)
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    spec = job(tiny_model, "contrastive", {"k": 5, "alpha": 0.6}, max_new=8)
    cuda.probe(lm, configure(lm, spec.strategy, spec.generation), spec)
    monkeypatch.setattr(planning, "prepared_mask", lambda model: False)
    cuda.probe(lm, configure(lm, spec.strategy, spec.generation), spec)
    rows = [each for _, each in cuda.asked]
    assert rows == [1, 5]
    # the shared candidates' probe prefills the longest prompt's bucket into its buffers; the repeated one is one pass
    assert cuda.peaks[0] is not None and cuda.peaks[1] is None
