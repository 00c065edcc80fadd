"""One own loop: the steps of contrastive, beam and diverse beam search run over transformers' own cache
where a model's layers do not take the preallocated one (a sliding-window model), and a model whose cache
the loop cannot reorder is refused in one line for the kinds transformers 5 no longer runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.support.engine import MIXED, job, with_generation
from worker.core.contract import ModelSpec
from worker.core.errors import PermanentJobError
from worker.engine import plan as planning
from worker.engine.job import generate_job
from worker.engine.plan import Cache, Path, configure

CASES = [
    ("contrastive", {"k": 3, "alpha": 0.6}),
    ("beam", {"num_beams": 3}),
    ("diverse_beam", {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.8}),
]


@pytest.fixture(scope="module")
def sliding_model(tiny_model, tmp_path_factory):
    from transformers import AutoTokenizer, MistralForCausalLM

    from tests.support.engine import sliding_window_config

    path = tmp_path_factory.mktemp("sliding")
    torch.manual_seed(0)
    MistralForCausalLM(sliding_window_config(vocab_size=4096)).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("strategy,params", CASES)
def test_a_sliding_window_model_runs_the_step_over_transformers_cache_each_prompt_as_alone(
    sliding_model, runtime, strategy, params
):
    spec = job(sliding_model, strategy, params, batch_size=4, max_new=10, stop=[","], prompts=MIXED[:6])
    result, batched = generate_job(spec, runtime)
    plan = result.engine["plan"]
    assert plan["path"] == "decode" and plan["cache"] == "dynamic" and not plan["refill"]
    assert result.engine["decode_loop"].startswith("worker.engine.decode (")
    _, alone = generate_job(with_generation(spec, batch_size=1, refill=False), runtime)
    assert [(r.token_ids, r.stop_reason) for r in batched] == [(r.token_ids, r.stop_reason) for r in alone]


def test_a_cache_the_loop_cannot_reorder_refuses_what_only_the_engine_runs(tiny_model, runtime, monkeypatch):
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    real = planning.probes
    monkeypatch.setattr(
        planning, "probes", lambda model: dataclasses.replace(real(model), preallocated=False, reorderable=False)
    )
    for strategy, params in CASES:
        spec = job(tiny_model, strategy, params)
        if strategy == "beam":  # transformers still runs it
            plan = configure(lm, spec.strategy, spec.generation)
            assert plan.path is Path.GENERATE and plan.cache is Cache.DYNAMIC
            continue
        with pytest.raises(PermanentJobError) as err:
            configure(lm, spec.strategy, spec.generation)
        assert str(err.value).startswith(f"{strategy}: this model's KV cache") and "\n" not in str(err.value)
