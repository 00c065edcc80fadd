"""The decode step captured as CUDA graphs (worker.engine.graphs, `decode_step: graphs`) on a real GPU (run by
scripts/device-checks.sh on a lent device; skipped elsewhere, where tests/unit/worker/engine/test_graphs.py runs
the same static step eagerly and the capture's bookkeeping with a CPU stand-in).

- Greedy tokens identical graphed and eager, for a stream, plain batches, beam and contrastive search; the
  seeded sampler's draws identical (its uniforms are precomputed: the graphs change only the logits' arithmetic).
- Every bucket captured once, replayed after that, none failed, no eager fallback; the graphs' pool reported.
- Outside a capture (which synchronises once, at its start), no graphed step synchronises with the host.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.engine import MIXED, with_generation
from tests.support.engine import job as engine_job
from worker.engine import graphs
from worker.engine.call import ModelCall
from worker.engine.job import Runtime, generate_job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/device-checks.sh)")

CASES = [
    ("greedy", {}, {"batch_size": 4, "stop": ["."]}),
    ("greedy", {}, {"batch_size": 4, "refill": False}),
    ("greedy", {"repetition_penalty": 1.2}, {"batch_size": 1}),
    ("beam", {"num_beams": 3}, {"batch_size": 4}),
    ("contrastive", {"k": 4, "alpha": 0.6}, {"batch_size": 4}),
    ("top_p", {"p": 0.9}, {"batch_size": 4}),
    ("min_p", {"p": 0.1}, {"batch_size": 8}),
]


@pytest.fixture(scope="module")
def cuda_runtime():
    return Runtime("cuda:0")


def _spec(model, strategy, params, settings, step, dtype="float32"):
    spec = engine_job(model, strategy, params, max_new=32, prompts=MIXED, dtype=dtype, seed=5)
    return with_generation(spec, decode_step=step, **settings)


@pytest.mark.parametrize("strategy,params,settings", CASES, ids=lambda c: str(c))
def test_graphed_tokens_are_the_eager_ones(small_model, cuda_runtime, strategy, params, settings):
    _, eager = generate_job(_spec(small_model, strategy, params, settings, "eager"), cuda_runtime)
    result, graphed = generate_job(_spec(small_model, strategy, params, settings, "graphs"), cuda_runtime)
    same = sum(a.token_ids == b.token_ids for a, b in zip(graphed, eager))
    if strategy in ("greedy", "beam", "contrastive"):
        assert same == len(eager)
    else:  # float32 on a GPU: a rare near-tie of the sampler's CDF may flip one draw
        assert same >= len(eager) - 1
    step = result.engine["decode_step"]
    assert step["mode"] == result.engine["plan"]["decode_step"] == "graphs"
    assert step["capture_failed"] == {} and step["eager_steps"] == 0, step
    assert step["graphs_captured"] >= len(step["buckets"]) and step["graph_replays"] > 0
    assert step["graph_pool_mib"] >= 0
    print(strategy, settings, step)  # the device run's log: buckets, replays, the pool


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_graphed_greedy_in_reduced_precision_matches_eager(small_model, cuda_runtime, dtype):
    _, eager = generate_job(_spec(small_model, "greedy", {}, {"batch_size": 8}, "eager", dtype), cuda_runtime)
    _, graphed = generate_job(_spec(small_model, "greedy", {}, {"batch_size": 8}, "graphs", dtype), cuda_runtime)
    same = sum(a.token_ids == b.token_ids for a, b in zip(graphed, eager))
    print(dtype, f"{same}/{len(eager)} identical")
    assert same >= 0.75 * len(eager)  # attention over more (masked) columns: near-ties flip in 16 bits


def test_no_graphed_step_synchronises_the_host_outside_its_capture(small_model, cuda_runtime, monkeypatch):
    steps = []

    def strict(method, mode):
        def run(*args, **kwargs):
            steps.append(method.__name__)
            torch.cuda.set_sync_debug_mode(mode)
            try:
                return method(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("error" if mode == "default" else "default")

        return run

    monkeypatch.setattr(ModelCall, "forward", strict(ModelCall.forward, "error"))
    monkeypatch.setattr(graphs.CudaCapture, "capture", strict(graphs.CudaCapture.capture, "default"))
    spec = _spec(small_model, "top_p", {"p": 0.9}, {"batch_size": 2}, "graphs")
    result, _ = generate_job(spec, cuda_runtime)
    assert steps.count("forward") >= 32 and steps.count("capture") >= 1
    assert result.engine["decode_step"]["graph_replays"] > 0
