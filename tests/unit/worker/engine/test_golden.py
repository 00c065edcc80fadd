"""The engine's outputs are token-identical to the recorded golden set (golden/engine_tokens.json beside this
file): greedy, seeded sampling, contrastive, beam and diverse beam search, as streams and as batches, on the
bundled models. Re-record only on purpose: `python -m tests.unit.worker.engine.golden.record`."""

from __future__ import annotations

import json

import pytest

from tests.unit.worker.engine.golden.record import CASES, GOLDEN, MODELS, job


@pytest.mark.parametrize("model", sorted(MODELS))
def test_outputs_are_the_recorded_ones(model, runtime):
    from worker.engine.job import generate_job

    golden = json.loads(GOLDEN.read_text())[model]
    assert sorted(golden) == sorted(case[0] for case in CASES)
    for case, strategy, params, settings, options in CASES:
        _, records = generate_job(job(MODELS[model], strategy, params, settings, options), runtime)
        assert [r.token_ids for r in records] == golden[case], case
