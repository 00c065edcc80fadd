"""Penalties row by row (worker.engine.modifiers): a row alone is transformers' processors exactly, and in a
padded batch or a stream each row is modified as it would be alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GenerationConfig
from transformers.generation import logits_process as lp

from tests.support.engine import MIXED, job, unbatched_greedy
from worker.core.contract import ModelSpec
from worker.engine.job import generate_job
from worker.engine.modifiers import RowModifiers

VOCAB, EOS = 12, 0
PENALTIES = [{"repetition_penalty": 1.3, "no_repeat_ngram_size": 2}, {"no_repeat_ngram_size": 3}]


def config(penalty=None, ngram=None, min_new=0) -> GenerationConfig:
    return GenerationConfig(
        repetition_penalty=penalty, no_repeat_ngram_size=ngram, min_new_tokens=min_new, eos_token_id=EOS
    )


def transformers_alone(cfg, ids: list[int], prompt_len: int, scores):
    """What generate() applies to one unpadded row (its processors, in generate()'s order)."""
    procs = []
    if cfg.repetition_penalty not in (None, 1.0):
        procs.append(lp.RepetitionPenaltyLogitsProcessor(cfg.repetition_penalty))
    if cfg.no_repeat_ngram_size:
        procs.append(lp.NoRepeatNGramLogitsProcessor(cfg.no_repeat_ngram_size))
    if cfg.min_new_tokens:
        procs.append(lp.MinNewTokensLengthLogitsProcessor(prompt_len, cfg.min_new_tokens, EOS))
    return lp.LogitsProcessorList(procs)(torch.tensor([ids]), scores)


def rows_of(seqs: list[list[int]], steps: list[int], pad: int = EOS):
    """A left-padded batch as the loop's Rows holds it (ids, attention mask, per-row steps)."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
    attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    return SimpleNamespace(ids=ids, attn=attn, steps=torch.tensor(steps))


modifier_configs = st.builds(
    config,
    penalty=st.sampled_from([None, 1.3, 0.8]),
    ngram=st.sampled_from([None, 1, 2, 3]),
    min_new=st.integers(0, 4),
)
sequences = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10)


@settings(max_examples=150, deadline=None)
@given(cfg=modifier_configs, seqs=st.lists(sequences, min_size=1, max_size=4), data=st.data())
def test_each_row_of_a_padded_batch_gets_exactly_what_transformers_gives_it_alone(cfg, seqs, data):
    steps = [data.draw(st.integers(0, len(s))) for s in seqs]  # the tail of each row it generated
    scores = torch.randn(len(seqs), VOCAB, generator=torch.Generator().manual_seed(len(seqs)))
    ours = RowModifiers(cfg)(rows_of(seqs, steps), scores.clone())
    for i, (seq, step) in enumerate(zip(seqs, steps)):
        alone = transformers_alone(cfg, seq, len(seq) - step, scores[i : i + 1].clone())
        assert torch.equal(ours[i : i + 1], alone), (i, seq, step)


def test_transformers_penalises_a_padded_rows_pad_id_which_is_its_eos_and_the_rows_do_not():
    """What row by row fixes: with pad = EOS, a padded row's EOS is penalised by its padding."""
    seqs, scores = [[5, 6, 7, 8], [5, 6]], torch.full((2, VOCAB), 2.0)
    batch = rows_of(seqs, [0, 0])
    theirs = lp.RepetitionPenaltyLogitsProcessor(1.5)(batch.ids, scores.clone())
    ours = RowModifiers(config(penalty=1.5))(batch, scores.clone())
    assert theirs[1, EOS] < 2.0 and ours[1, EOS] == 2.0 and ours[0, EOS] == 2.0
    assert torch.equal(ours[1, 5:7], theirs[1, 5:7]) and ours[1, 6] < 2.0


def test_no_modifiers_or_a_minimum_without_eos_changes_nothing():
    scores = torch.randn(2, VOCAB)
    for cfg in (config(), GenerationConfig(min_new_tokens=3)):
        assert torch.equal(RowModifiers(cfg)(rows_of([[1, 2], [3]], [0, 0]), scores), scores)


@pytest.mark.parametrize("params", PENALTIES)
def test_a_penalised_stream_is_each_prompts_unbatched_generate(small_model, runtime, params):
    """Penalties and a minimum length no longer keep a job batch after batch: the stream's rows are each
    prompt's own generate() with the same settings."""
    lm = runtime.cache.get(ModelSpec(path=small_model), runtime.device)
    spec = job(small_model, "greedy", params, batch_size=3, max_new=24, stop=[","], prompts=MIXED)
    spec = spec.model_copy(update={"generation": spec.generation.model_copy(update={"min_new_tokens": 3})})
    result, records = generate_job(spec, runtime)
    (stream,) = result.batches
    assert stream.refills >= 1 and "refilled" in result.engine["decode_loop"]
    assert result.engine["modifiers"].startswith("per row")
    for prompt, rec in zip(MIXED, records):
        want = unbatched_greedy(lm, prompt, 24, **params, min_new_tokens=3)
        assert rec.token_ids == want[: rec.n_new_tokens], prompt


SHORT, LONG = "She had never seen", "It was a truth universally acknowledged, that a single man in possession"


@pytest.fixture(scope="module")
def eos_model(tiny_model, tmp_path_factory):
    """A random-weight Llama whose EOS (= pad, id 0) just wins the first step after SHORT: penalising the pad id
    of SHORT's padding in a batch (as a processor without the mask would) lets another token win instead."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.engine import small_config

    tok = AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(small_config("llama")).eval()
    seen = {}
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.update(h=inp[0][0, -1].clone()))
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # logits of a few units, so a 1.3 penalty moves them by more than the margin
        logits = model(**tok(SHORT, return_tensors="pt")).logits[0, -1]
        hook.remove()
        top, h = int(logits.argmax()), seen["h"]
        model.lm_head.weight[EOS] = model.lm_head.weight[top] + (0.05 / h.dot(h)) * h  # EOS = top + 0.05
    path = tmp_path_factory.mktemp("eos-llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("strategy,params", [("greedy", {}), ("contrastive", {"k": 4, "alpha": 0.0})])
def test_a_padded_rows_eos_is_not_penalised_by_its_padding(eos_model, runtime, strategy, params):
    """The engine's own loop and a strategy's own loop (contrastive, alpha 0: its top candidate) alike;
    a processor without the padding mask (the engine before) ran SHORT to the length limit in this batch."""
    params = {**params, "repetition_penalty": 1.3}
    batch = job(eos_model, strategy, params, batch_size=2, max_new=6, prompts=[LONG, SHORT])
    batch = batch.model_copy(update={"generation": batch.generation.model_copy(update={"refill": False})})
    _, alone = generate_job(job(eos_model, strategy, params, batch_size=1, max_new=6, prompts=[SHORT]), runtime)
    assert alone[0].stop_reason == "eos" and alone[0].token_ids == [EOS]  # EOS first, alone
    _, batched = generate_job(batch, runtime)
    assert (batched[1].token_ids, batched[1].stop_reason) == (alone[0].token_ids, "eos")
