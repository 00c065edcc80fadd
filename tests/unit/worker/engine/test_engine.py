"""The generation engine on a bundled model: exactness, seeding, batching, stop reasons, scoring."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.engine import MIXED, job, texts
from tests.support.services import AUSTEN_PROMPTS
from worker.core.contract import ModelSpec
from worker.core.errors import PermanentJobError, UsageError
from worker.engine import generate as engine
from worker.engine.job import EngineSettings, Runtime, generate_job
from worker.engine.models import load
from worker.engine.sampling import generation_seed

PROMPTS = AUSTEN_PROMPTS


def test_greedy_equals_direct_generate(tiny_model, runtime):
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    _, records, _ = texts(runtime, job(tiny_model, "greedy", batch_size=4, max_new=20))
    eos = lm.tokenizer.eos_token_id
    for prompt, rec in zip(PROMPTS, records):
        enc = lm.tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            out = lm.model.generate(**enc, do_sample=False, max_new_tokens=20, pad_token_id=eos)
        direct = out[0, enc["input_ids"].shape[1] :].tolist()
        if eos in direct:
            direct = direct[: direct.index(eos) + 1]
        assert rec.token_ids == direct, prompt


def test_greedy_batch_1_equals_batch_8(tiny_model, runtime):
    one, _, _ = texts(runtime, job(tiny_model, "greedy", batch_size=1))
    eight, _, _ = texts(runtime, job(tiny_model, "greedy", batch_size=8))
    assert one == eight


def test_sampling_is_seeded_per_generation(tiny_model, runtime):
    a, _, _ = texts(runtime, job(tiny_model, "top_p", {"p": 0.95}, seed=1))
    again, _, _ = texts(runtime, job(tiny_model, "top_p", {"p": 0.95}, seed=1))
    other, _, _ = texts(runtime, job(tiny_model, "top_p", {"p": 0.95}, seed=2))
    assert a == again
    assert sum(x != y for x, y in zip(a, other)) >= len(a) // 2
    # the same seed gives the same text whatever the batch composition (CPU, fp32)
    rebatched, _, _ = texts(runtime, job(tiny_model, "top_p", {"p": 0.95}, seed=1, batch_size=3))
    assert rebatched == a


def test_every_registered_strategy_runs(tiny_model, runtime):
    from worker.strategies import STRATEGIES

    for name in STRATEGIES.names():
        params = {"assistant": tiny_model} if name == "assisted" else None
        out, records, result = texts(runtime, job(tiny_model, name, params, prompts=PROMPTS[:2], max_new=6))
        assert len(records) == 2 and all(r.n_new_tokens >= 1 for r in records), name
        assert result.generation_config["max_new_tokens"] == 6


@pytest.mark.parametrize("param", ["temperature", "repetition_penalty"])
def test_a_divisor_whose_scores_overflow_is_refused_and_the_floor_is_greedy(tiny_model, runtime, param):
    """Scores divided by a temperature or repetition penalty of 1e-300 are inf in float32, their softmax NaN:
    the draw returned the vocabulary's last token at every step ("independent independent ..."), silently.
    Such a value is refused in one line naming it; the lowest temperature taken samples the greedy text."""
    from controller.sweep.load import parse_spec

    spec = {"name": "t", "models": [{"path": tiny_model}], "prompts": {"inline": ["Anne"]}}
    with pytest.raises(UsageError, match=rf"strategies\[0\]: params.{param} must be >= 1e-05, got 1e-300$"):
        parse_spec({**spec, "strategies": [{"name": "sample", "params": {param: 1e-300}}]})
    greedy, _, _ = texts(runtime, job(tiny_model, "greedy", max_new=12))
    coldest, _, _ = texts(runtime, job(tiny_model, "top_k", {"k": 10, "temperature": 1e-5}, seed=4, max_new=12))
    assert coldest == greedy


def test_stop_strings_and_stop_reasons(tiny_model, runtime):
    _, records, _ = texts(runtime, job(tiny_model, "sample", seed=3, max_new=40, stop=[","]))
    reasons = {r.stop_reason for r in records}
    assert "stop_string" in reasons
    for r in records:
        assert "," not in r.text
        assert r.stop_reason in ("eos", "length", "stop_string")
        if r.stop_reason == "length":
            assert r.n_new_tokens == 40


def test_perplexity_scoring_matches_a_direct_forward_pass(tiny_model, runtime):
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    _, records, _ = texts(runtime, job(tiny_model, "greedy", metrics=["perplexity"], prompts=PROMPTS[:3]))
    for rec in records:
        ctx = lm.tokenizer(rec.prompt)["input_ids"]
        ids = torch.tensor([ctx + rec.token_ids])
        with torch.inference_mode():
            logp = torch.log_softmax(lm.model(ids).logits[0, :-1].float(), -1)
        nll = -sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(rec.token_ids))
        assert rec.nll_count == len(rec.token_ids)
        assert math.isclose(rec.nll_sum, nll, rel_tol=1e-4)


def test_result_records_timings_memory_and_provenance(tiny_model, runtime, monkeypatch):
    # What the chart sets: the image reference and the downward API's pod and node names.
    monkeypatch.setenv("DECODEBENCH_IMAGE", "r.example/decodebench-worker:1.0@sha256:" + "a" * 64)
    monkeypatch.setenv("POD_NAME", "db-decodebench-worker-gpu-7d9c6b5f4-x2x7k")
    monkeypatch.setenv("NODE_NAME", "ip-10-0-1-7")
    monkeypatch.setattr(runtime, "settings", EngineSettings.from_environment())  # as the worker's start reads them
    spec = job(tiny_model, "greedy", batch_size=4)
    batched = spec.model_copy(update={"generation": spec.generation.model_copy(update={"refill": False})})
    _, records, result = texts(runtime, batched)
    assert len(result.batches) == 3  # 9 prompts in batches of 4 (refill: false)
    for b in result.batches:
        assert 0 < b.prefill_s <= b.total_s and math.isclose(b.decode_s, b.total_s - b.prefill_s)
    assert result.memory["rss_peak_mb"] > 0 and result.memory["torch_peak_mb"] is None
    prov = result.provenance
    assert prov["device"]["type"] == "cpu" and prov["model"]["content_hash"]
    assert prov["torch"] == torch.__version__ and prov["transformers"]
    assert prov["torch_cuda"] == torch.version.cuda  # the CUDA torch was built for (None on a CPU build)
    assert prov["image"] == "r.example/decodebench-worker:1.0@sha256:" + "a" * 64
    assert (prov["pod"], prov["node"]) == ("db-decodebench-worker-gpu-7d9c6b5f4-x2x7k", "ip-10-0-1-7")
    assert result.generation_config["pad_token_id"] is not None


def test_no_silent_device_fallback(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="CUDA is not available"):
        Runtime("cuda:0")
    with pytest.raises(UsageError, match="use cpu or cuda:N"):
        Runtime("gpu")


def test_missing_model_is_a_permanent_error(tmp_path, runtime):
    with pytest.raises(PermanentJobError, match="does not exist"):
        load(ModelSpec(path=str(tmp_path / "nope")), runtime.device)


def test_generation_seed_is_stable():
    """Pinned values: a change to the seed derivation would silently change every sampled text."""
    assert generation_seed(0, "p1") == 8969202611906589725
    assert generation_seed(7, "heldout-0001") == 2131446436721178557
    assert generation_seed(0, "p1") != generation_seed(1, "p1")


def test_step_clock_stamps_each_step_and_derives_prefill():
    """On CPU the clock stamps perf_counter values: the first step is the first logits (prefill)."""
    import time

    from worker.engine.timing import StepClock

    clock = StepClock(torch.device("cpu"))
    clock.start()
    time.sleep(0.02)
    for _ in range(3):
        assert clock(None, "scores") == "scores"  # changes no score
        time.sleep(0.01)
    times = clock.stop()
    assert times.steps == 3 and 0.02 <= times.prefill_s < times.total_s
    clock.start()
    assert clock.stop().steps == 0  # a call without a step: prefill is the whole call


def naive_contrastive(model, ids: list[int], k: int, alpha: float, steps: int) -> list[int]:
    """Contrastive search written from the paper, without a cache: a full forward per candidate."""
    out = list(ids)
    for _ in range(steps):
        with torch.inference_mode():
            base = model(torch.tensor([out]), output_hidden_states=True)
        probs = torch.softmax(base.logits[0, -1].float(), -1)
        context = torch.nn.functional.normalize(base.hidden_states[-1][0].float(), dim=-1)
        top_p, top_ids = probs.topk(k)
        best, best_score = None, -float("inf")
        for p, v in zip(top_p.tolist(), top_ids.tolist()):
            with torch.inference_mode():
                h = model(torch.tensor([out + [v]]), output_hidden_states=True).hidden_states[-1][0, -1].float()
            score = (1 - alpha) * p - alpha * float((context @ torch.nn.functional.normalize(h, dim=-1)).max())
            if score > best_score:
                best, best_score = v, score
        out.append(best)
    return out[len(ids) :]


def test_contrastive_search_matches_the_paper_and_reduces_to_greedy(tiny_model, runtime):
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    _, records, result = texts(
        runtime, job(tiny_model, "contrastive", {"k": 4, "alpha": 0.6}, max_new=10, prompts=PROMPTS[:4])
    )
    assert result.generation_config["decodebench_loop"]["alpha"] == 0.6
    for rec in records:
        expected = naive_contrastive(lm.model, lm.tokenizer(rec.prompt)["input_ids"], 4, 0.6, 10)
        eos = lm.tokenizer.eos_token_id
        if eos in expected:
            expected = expected[: expected.index(eos) + 1]
        assert rec.token_ids == expected, rec.prompt
    greedy, _, _ = texts(runtime, job(tiny_model, "greedy", max_new=10))
    alpha0, _, _ = texts(runtime, job(tiny_model, "contrastive", {"k": 5, "alpha": 0.0}, max_new=10))
    assert alpha0 == greedy


def test_contrastive_k_past_the_vocabulary_is_refused_in_one_line(tiny_model, runtime):
    """k = 5000 over 4096 tokens failed mid-batch with torch's "selected index k out of range"; the whole
    vocabulary as candidates still runs (alpha 0: greedy search)."""
    with pytest.raises(PermanentJobError, match=r"^contrastive: k \(5000\) is more candidates than the model has "):
        generate_job(job(tiny_model, "contrastive", {"k": 5000}, max_new=2, prompts=PROMPTS[:2]), runtime)
    greedy, _, _ = texts(runtime, job(tiny_model, "greedy", max_new=3, prompts=PROMPTS[:2]))
    whole = job(tiny_model, "contrastive", {"k": 4096, "alpha": 0.0}, max_new=3, prompts=PROMPTS[:2])
    every, _, _ = texts(runtime, whole)
    assert every == greedy


def test_assisted_decoding_equals_greedy(tiny_model, small_model, runtime):
    greedy, _, _ = texts(runtime, job(small_model, "greedy", max_new=12, prompts=PROMPTS[:3]))
    assisted, records, result = texts(
        runtime,
        job(
            small_model,
            "assisted",
            {"assistant": tiny_model, "num_assistant_tokens": 3},
            max_new=12,
            prompts=PROMPTS[:3],
        ),
    )
    assert assisted == greedy
    assert result.generation_config["decodebench_assistant"]["path"] == tiny_model
    assert any("batch_size 4 -> 1" in n for n in result.notes)
    assert all(b.n == 1 for b in result.batches)


@pytest.mark.parametrize("stop", [["the same"], [","]], ids=repr)
def test_assisted_decoding_with_stop_strings_equals_greedy(tiny_model, small_model, runtime, stop):
    """Every assisted job with a stop string failed: its draft model's generate() was handed the config's
    stop_strings without a tokenizer (transformers' ValueError). Now its texts, tokens and stop reasons are
    greedy search's, a stop string inside a verification step's accepted tokens included."""
    greedy, expected, _ = texts(runtime, job(small_model, "greedy", max_new=16, prompts=MIXED[:4], stop=stop))
    assisted, records, _ = texts(
        runtime, job(small_model, "assisted", {"assistant": tiny_model}, max_new=16, prompts=MIXED[:4], stop=stop)
    )
    assert assisted == greedy
    assert [(r.token_ids, r.stop_reason) for r in records] == [(r.token_ids, r.stop_reason) for r in expected]
    assert any(r.stop_reason == "stop_string" for r in records)


def test_cuda_oom_halves_the_batch_and_says_so(tiny_model, runtime, monkeypatch):
    calls = []
    real = engine.run_batch

    def flaky(lm, plan, prompts, seeds, slots=None):
        calls.append(len(prompts))
        if len(prompts) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated at batch > 1)")
        return real(lm, plan, prompts, seeds, slots)

    monkeypatch.setattr(engine, "run_batch", flaky)
    result, records = generate_job(job(tiny_model, "greedy", batch_size=4, prompts=PROMPTS[:4]), runtime)
    assert len(records) == 4 and calls[:3] == [4, 2, 1]
    assert any("halved" in n for n in result.notes)


def test_ctrl_c_while_the_finisher_starts_finishes_nothing_afterwards(tiny_model, runtime, monkeypatch):
    """Ctrl-C can land while the pool starts its finisher thread (CI saw it: a `batch.done` line after
    `run`'s "interrupted" line). The pool then does not know its own thread and its shutdown waits for
    nothing; the job must still finish (and log) no batch after it has raised."""
    import threading
    import time

    ended: list[float] = []
    real_finish, real_start = engine.finish_batch, threading.Thread.start

    def slow_finish(*args, **kwargs):
        time.sleep(0.3)
        try:
            return real_finish(*args, **kwargs)
        finally:
            ended.append(time.monotonic())

    def start_then_ctrl_c(thread):
        real_start(thread)
        if thread.name.startswith("decodebench-finish"):
            raise KeyboardInterrupt  # as if SIGINT arrived during Thread.start's wait

    monkeypatch.setattr(engine, "finish_batch", slow_finish)
    monkeypatch.setattr(threading.Thread, "start", start_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        generate_job(job(tiny_model, "greedy", batch_size=4, max_new=4), runtime)
    gave_up = time.monotonic()
    monkeypatch.setattr(threading.Thread, "start", real_start)
    time.sleep(0.6)  # the finisher thread's queued batch had time to run
    assert all(t <= gave_up for t in ended), "a batch was finished after the job gave up"
