"""Coherence (Su & Collier 2022) equals a direct computation with the scorer model on the bundled models."""

from __future__ import annotations

import math

import pytest
import torch

from controller.metrics import METRICS, cell_data
from tests.support.engine import job
from tests.support.services import AUSTEN_PROMPTS
from worker.core.contract import JobSpec, ModelSpec
from worker.engine.job import generate_job

PROMPTS = AUSTEN_PROMPTS[:4]


def _job(model: str, metrics: list[str], scorer: str | None = None) -> JobSpec:
    return job(
        model, "top_p", {"p": 0.9}, 3, 1, 12, metrics=metrics, prompts=PROMPTS, scorer=scorer, job_id="j-coherence"
    )


def _direct_mean_logp(lm, prompt: str, continuation: list[int]) -> float:
    """Mean log p(continuation token | prompt, earlier tokens) with one unbatched forward pass."""
    ctx = lm.tokenizer(prompt)["input_ids"]
    ids = torch.tensor([ctx + continuation])
    with torch.inference_mode():
        logp = torch.log_softmax(lm.model(ids).logits[0, :-1].float(), -1)
    return sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(continuation)) / len(continuation)


def test_coherence_equals_a_direct_computation_with_the_cells_own_model(tiny_model, runtime):
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    _, records = generate_job(_job(tiny_model, ["coherence"]), runtime)  # coherence alone asks for scores
    direct = [_direct_mean_logp(lm, r.prompt, r.token_ids) for r in records]
    value = METRICS.get("coherence").fn(cell_data(records))
    assert value is not None and value < 0
    assert math.isclose(value, sum(direct) / len(direct), rel_tol=1e-4)


def test_coherence_uses_the_sweep_wide_scorer(tiny_model, small_model, runtime):
    scorer = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    _, records = generate_job(_job(tiny_model, ["coherence"], scorer=small_model), runtime)
    # the two bundled models share one tokenizer: the scorer scores the stored ids
    # (tests/unit/worker/engine/test_scoring_path.py)
    direct = [_direct_mean_logp(scorer, r.prompt, r.token_ids) for r in records]
    value = METRICS.get("coherence").fn(cell_data(records))
    assert math.isclose(value, sum(direct) / len(direct), rel_tol=1e-4)
    own = METRICS.get("coherence").fn(cell_data(generate_job(_job(tiny_model, ["coherence"]), runtime)[1]))
    assert not math.isclose(value, own, rel_tol=1e-3)  # a different scorer gives a different value


def test_coherence_is_a_mean_of_per_generation_means_and_empty_without_scores():
    c = cell_data([{"text": "a", "nll_sum": 2.0, "nll_count": 2}, {"text": "b c", "nll_sum": 9.0, "nll_count": 3}])
    assert METRICS.get("coherence").fn(c) == pytest.approx((-1.0 + -3.0) / 2)  # not token-weighted (-11/5)
    missing = cell_data([{"text": "a", "nll_sum": 2.0, "nll_count": 2}, {"text": "b"}])
    assert METRICS.get("coherence").fn(missing) is None
    m = METRICS.get("coherence")
    assert m.additive and m.interval == "bootstrap" and m.needs_model and m.higher_is_better is True
    unscored = cell_data([{"text": "a", "nll_sum": 2.0, "nll_count": 2}, {"text": "", "nll_sum": 0.0, "nll_count": 0}])
    assert METRICS.get("coherence").fn(unscored) == pytest.approx(-1.0)  # no token scored: left out of the mean
