"""One scoring path (issue 25 item 6): a `scorer` that is the generating model, or shares its tokenizer,
scores the stored token ids, so a sampled cell's perplexity and coherence equal self-scoring's; a
generated EOS is scored and counted on both paths; a scorer with another tokenizer scores the
re-tokenised text with its own EOS appended. Checked against log-softmax written here."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from controller.metrics import METRICS, cell_data
from tests.support.engine import job
from tests.support.services import AUSTEN_PROMPTS, TINY_MODEL
from worker.core.contract import ModelSpec
from worker.engine.job import generate_job
from worker.engine.scoring import same_tokenizer

COMMA = 12  # "," in the bundled tokenizer: as the generator's EOS, most generations end at EOS


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """generator: the tiny model with "," as its EOS; twin: the same weights and tokenizer in another
    directory (another name, another load); foreign: the same weights, a tokenizer with one token more."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("scoring")
    out = {name: root / name for name in ("generator", "twin", "foreign")}
    for path in out.values():
        shutil.copytree(TINY_MODEL, path)
    config = json.loads((out["generator"] / "generation_config.json").read_text())
    (out["generator"] / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": COMMA}))
    tok = AutoTokenizer.from_pretrained(out["foreign"])
    tok.add_tokens(["<|extra|>"])
    tok.save_pretrained(out["foreign"])
    return {name: str(path) for name, path in out.items()}


def _records(runtime, generator: str, scorer: str | None = None):
    spec = job(generator, "top_p", {"p": 0.95}, 4, 3, 24, metrics=["perplexity", "coherence"],
               prompts=AUSTEN_PROMPTS[:8], scorer=scorer, job_id="j-scoring")  # fmt: skip
    return generate_job(spec, runtime)


def _metrics(records) -> tuple[float, float]:
    cell = cell_data(records)
    return METRICS.get("perplexity").fn(cell), METRICS.get("coherence").fn(cell)


def _direct(lm, ctx: list[int], cont: list[int]) -> float:
    """Σ −log p(cont | ctx) from one unbatched forward pass and a log-softmax over the logits."""
    ids = torch.tensor([ctx + cont])
    with torch.inference_mode():
        logits = lm.model(ids).logits[0].double()
    logp = logits[:-1] - torch.logsumexp(logits[:-1], dim=-1, keepdim=True)
    return -sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))


def _independent(nlls: list[float], counts: list[int]) -> tuple[float, float]:
    return math.exp(sum(nlls) / sum(counts)), sum(-s / c for s, c in zip(nlls, counts)) / len(nlls)


def test_the_generating_model_named_as_scorer_gives_the_self_scoring_values(models, runtime):
    _, own = _records(runtime, models["generator"])
    result, named = _records(runtime, models["generator"], scorer=models["twin"])
    assert [r.token_ids for r in named] == [r.token_ids for r in own]  # the same sampled generations
    ends = [r.stop_reason for r in own]
    assert "eos" in ends and "length" in ends
    for a, b in zip(own, named):
        assert b.nll_count == a.nll_count == len(a.token_ids)  # a generated EOS is scored and counted
        assert b.nll_sum == pytest.approx(a.nll_sum, rel=1e-5)
    assert _metrics(named) == pytest.approx(_metrics(own), rel=1e-6)
    assert result.provenance["scorer"]["scored"] == "generated token ids"
    lm = runtime.cache.get(ModelSpec(path=models["twin"]), runtime.device)
    nlls = [_direct(lm, lm.tokenizer(r.prompt)["input_ids"], r.token_ids) for r in named]
    assert _metrics(named) == pytest.approx(_independent(nlls, [len(r.token_ids) for r in named]), rel=1e-4)


def test_a_scorer_with_another_tokenizer_scores_the_text_and_its_own_eos(models, runtime):
    result, records = _records(runtime, models["generator"], scorer=models["foreign"])
    assert result.provenance["scorer"]["scored"] == "re-tokenised text"
    lm = runtime.cache.get(ModelSpec(path=models["foreign"]), runtime.device)
    eos = lm.tokenizer.eos_token_id
    conts = [
        lm.tokenizer(r.text, add_special_tokens=False)["input_ids"] + ([eos] if r.stop_reason == "eos" else [])
        for r in records
    ]
    assert [r.nll_count for r in records] == [len(c) for c in conts]
    nlls = [_direct(lm, lm.tokenizer(r.prompt)["input_ids"], c) for r, c in zip(records, conts)]
    assert _metrics(records) == pytest.approx(_independent(nlls, [len(c) for c in conts]), rel=1e-4)


def test_tokenizers_compare_by_their_vocabulary_not_their_name(models):
    from transformers import AutoTokenizer

    generator, twin, foreign = (AutoTokenizer.from_pretrained(models[k]) for k in ("generator", "twin", "foreign"))
    assert same_tokenizer(generator, twin, AUSTEN_PROMPTS)
    assert not same_tokenizer(generator, foreign, AUSTEN_PROMPTS)
    renamed = AutoTokenizer.from_pretrained(models["twin"])
    renamed.add_special_tokens({"eos_token": ","})  # same vocabulary, another EOS
    assert not same_tokenizer(generator, renamed, AUSTEN_PROMPTS)
