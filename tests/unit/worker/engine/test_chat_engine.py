"""Chat models on the own engine (issue 38, part 1), on the bundled chat model austen-tiny-chat: the ids the
engine feeds are apply_chat_template's (every strategy the same), a turn ends at <|im_end|>, the text is the
reply alone, result.json records the template's hash and the rendered prompts' lengths; a prompt the model
cannot take fails the job in one line. The vLLM side is tests/vllm/test_vllm_engine.py's, the distributed round trip
is tests/e2e/test_chat_distributed.py's."""

from __future__ import annotations

import hashlib

import pytest
import torch

from tests.support.engine import job
from tests.support.repo import REPO
from worker.core.chatformat import ChatMessage
from worker.core.contract import ModelSpec, PromptItem
from worker.core.errors import PermanentJobError
from worker.engine import chat
from worker.engine.job import generate_job, plan_job

pytestmark = pytest.mark.slow
CHAT = REPO / "examples" / "models" / "austen-tiny-chat"
SYSTEM = "You continue passages in the manner of Jane Austen."
OPENINGS = ["Anne had been", "It was a truth universally acknowledged that", "Sir Walter", "She was"]


def chat_job(strategy="greedy", params=None, max_new=24, **model):
    spec = job(CHAT, strategy, params, max_new=max_new, prompts=OPENINGS, batch_size=3, **model)
    turns = [ChatMessage(role="user", content="Begin."), ChatMessage(role="assistant", content="Yes.")]
    prompts = [*spec.prompts[:-1], PromptItem(id="conv", prompt="She was", messages=[*turns, *turns[:1]])]
    return spec.model_copy(update={"prompts": prompts})


def expected_ids(tok, item, system=SYSTEM):
    turns = [m.model_dump() for m in item.messages] if item.messages else [{"role": "user", "content": item.prompt}]
    turns = [{"role": "system", "content": system}, *turns]
    return tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def lm(runtime):
    return runtime.cache.get(ModelSpec(path=str(CHAT)), runtime.device)


def test_the_engine_feeds_apply_chat_template_ids_to_every_strategy(runtime, lm):
    for strategy, params in (("greedy", None), ("top_p", {"p": 0.9}), ("beam", {"num_beams": 2})):
        spec = chat_job(strategy, params, system=SYSTEM)
        fed = plan_job(spec, runtime, lm)[0].prompt_ids
        for item in spec.prompts:
            assert fed[item.id] == expected_ids(lm.tokenizer, item), (strategy, item.id)


def test_greedy_on_the_rendered_ids_equals_generate_and_ends_its_turn(runtime, lm):
    """What the engine wrote is transformers' greedy continuation of apply_chat_template's ids, cut at the end of
    the turn: the model was fed those ids, and <|im_end|> stops it as EOS does."""
    spec = chat_job(system=SYSTEM)
    result, records = generate_job(spec, runtime)
    tok, im_end = lm.tokenizer, lm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ends = {tok.eos_token_id, im_end}
    for item, rec in zip(spec.prompts, records):
        ids = torch.tensor([expected_ids(tok, item)])
        with torch.inference_mode():
            out = lm.model.generate(input_ids=ids, do_sample=False, max_new_tokens=24, eos_token_id=sorted(ends),
                                    pad_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()  # fmt: skip
        assert rec.token_ids == out, item.id
        assert "<|im" not in rec.text and rec.prompt == item.prompt
    ended = [r for r in records if r.stop_reason == "eos"]
    assert ended and all(r.token_ids[-1] == im_end for r in ended)  # the model ends its turn, not the text
    assert set(result.generation_config["eos_token_id"]) == ends
    record = result.engine["chat"]
    assert record["template_sha256"] == hashlib.sha256(tok.chat_template.encode()).hexdigest()
    assert record["prompt_tokens"] == {p.id: len(expected_ids(tok, p)) for p in spec.prompts}
    assert record["system"] == SYSTEM


def test_chat_false_feeds_the_raw_prompt(runtime, lm):
    spec = chat_job(chat=False)
    fed = plan_job(spec, runtime, lm)[0].prompt_ids
    assert all(fed[p.id] == lm.tokenizer(p.prompt)["input_ids"] for p in spec.prompts)
    assert "chat" not in generate_job(spec, runtime)[0].engine


def test_template_variables_reach_the_template(runtime, tmp_path):
    """chat_template_kwargs are the template's variables: a Qwen3-like template that writes an empty thought
    where enable_thinking is false."""
    import json
    import shutil

    model = tmp_path / "thinking-chat"
    shutil.copytree(CHAT, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] += "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    lm = runtime.cache.get(ModelSpec(path=str(model)), runtime.device)
    plain = job(model, prompts=["Anne"])
    thinking = job(model, prompts=["Anne"], chat_template_kwargs={"enable_thinking": False})
    [without], [with_kwargs] = chat.prompt_ids(lm.tokenizer, plain), chat.prompt_ids(lm.tokenizer, thinking)
    assert with_kwargs[: len(without)] == without
    assert lm.tokenizer.decode(with_kwargs[len(without) :]) == "<think></think>"


def test_a_prompt_the_model_cannot_take_fails_the_job_in_one_line(runtime, tiny_model):
    """The worker trusts no client: a job that skipped validation is refused before anything is generated."""
    turn = {"role": "user", "content": "Anne"}
    bad = job(tiny_model, prompts=["Anne"])
    bad = bad.model_copy(update={"prompts": [PromptItem(id="x1", prompt="Anne", messages=[turn])]})
    with pytest.raises(PermanentJobError, match="^prompt 'x1', model 'austen-tiny': the prompt has `messages`"):
        generate_job(bad, runtime)
    late = chat_job().model_copy(update={"prompts": [PromptItem(id="x2", prompt="Hi", messages=[
        {"role": "user", "content": "Hi"}, {"role": "system", "content": "Late"}])]})  # fmt: skip
    with pytest.raises(PermanentJobError, match="^prompt 'x2', model 'austen-tiny-chat': the chat template fails"):
        generate_job(late, runtime)
