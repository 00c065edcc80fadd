"""The typical, epsilon and eta filters the vLLM engine applies as a logits processor
(worker.engine.vllm.logitsprocs) are transformers' warpers, token for token, and agree with the
definitions the distribution test holds vLLM to (worker.engine.vllm.agreement). Without vLLM: the
filters are plain torch; tests/vllm/test_vllm_engine.py samples through vLLM itself."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import EpsilonLogitsWarper, EtaLogitsWarper, TypicalLogitsWarper

from worker.engine.vllm.agreement import filtered_probs
from worker.engine.vllm.logitsprocs import FILTER_KEY, filter_of, truncate

CASES = [
    ("typical", "mass", [0.2, 0.5, 0.95]),
    ("epsilon", "epsilon", [3e-4, 0.01, 0.05]),
    ("eta", "eta", [3e-4, 0.01, 0.1]),
]
WARPERS = {
    "typical": lambda v: TypicalLogitsWarper(mass=v),
    "epsilon": lambda v: EpsilonLogitsWarper(epsilon=v),
    "eta": lambda v: EtaLogitsWarper(epsilon=v, device="cpu"),
}


def rows(n: int = 24, vocab: int = 500) -> torch.Tensor:
    """Peaked and flat rows alike: scaled Gaussian logits, a few with a dominant token."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(n, vocab, generator=g) * torch.linspace(0.3, 6.0, n)[:, None]
    logits[::5, 3] += 12.0
    return logits


@pytest.mark.parametrize(("kind", "key", "values"), CASES, ids=[c[0] for c in CASES])
def test_each_filter_is_transformers_warper_token_for_token(kind, key, values):
    for value in values:
        for dtype in (torch.float32, torch.float64):
            logits = rows().to(dtype)
            want = WARPERS[kind](value)(torch.zeros(len(logits), 1, dtype=torch.long), logits.clone())
            got = torch.stack([truncate(row.clone(), kind, value) for row in logits])
            assert torch.equal(torch.isinf(got), torch.isinf(want)), (kind, value, dtype)
            assert torch.equal(got[~torch.isinf(got)], logits[~torch.isinf(got)])  # kept logits untouched
            assert (~torch.isinf(got)).any(dim=-1).all()  # never an empty row
            for row, filtered in zip(logits.double(), got, strict=True):  # the definition in float64
                kept = filtered_probs(row, kind, {key: value}) > 0
                assert torch.equal(kept, ~torch.isinf(filtered)), (kind, value, dtype)


def test_only_sampled_requests_that_name_a_filter_are_filtered():
    class Params:
        def __init__(self, extra_args, temperature=1.0):
            self.extra_args, self.temperature = extra_args, temperature

    assert filter_of(Params({FILTER_KEY: {"kind": "eta", "value": 0.01}})) == ("eta", 0.01)
    assert filter_of(Params({FILTER_KEY: {"kind": "eta", "value": 0.01}}, temperature=0.0)) is None
    assert filter_of(Params(None)) is None and filter_of(None) is None


def test_only_the_llm_of_typical_epsilon_and_eta_cells_gets_the_processor():
    """Every other cell runs plain vLLM (and its default model runner): the processor is opt-in per LLM."""
    from worker.core.contract import ModelSpec
    from worker.core.engines import VllmEngine
    from worker.engine.vllm.llm import llm_kwargs
    from worker.engine.vllm.logitsprocs import PATH

    model, engine = ModelSpec(path="/m"), VllmEngine(name="vllm")
    assert "logits_processors" not in llm_kwargs(model, engine, "cuda")
    assert llm_kwargs(model, engine, "cuda", filters=True)["logits_processors"] == [PATH]
    assert llm_kwargs(model, engine, "cpu")["max_logprobs"] == -1  # the distribution check's full vocabulary
