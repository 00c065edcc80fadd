"""Chat models on the own engine (issue 38, part 1), on the bundled chat model austen-tiny-chat: the ids the
engine feeds are apply_chat_template's (every strategy the same), a turn ends at <|im_end|>, the text is the
reply alone, result.json records the template's hash and the rendered prompts' lengths; a prompt the model
cannot take fails the job in one line. The vLLM side is tests/vllm/test_vllm_parity.py's, the distributed round trip
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
    with pytest.raises(PermanentJobError, match="^prompt 'x1', model 'austen-tiny': the prompt is a conversation"):
        generate_job(bad, runtime)
    late = chat_job().model_copy(update={"prompts": [PromptItem(id="x2", prompt="Hi", messages=[
        {"role": "user", "content": "Hi"}, {"role": "system", "content": "Late"}])]})  # fmt: skip
    with pytest.raises(PermanentJobError, match="^prompt 'x2', model 'austen-tiny-chat': the chat template fails"):
        generate_job(late, runtime)
    answer = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "It was"}]  # to continue: no
    prefilled = chat_job().model_copy(update={"prompts": [PromptItem(id="x3", prompt="Hi", messages=answer)]})
    with pytest.raises(PermanentJobError, match="^prompt 'x3', model 'austen-tiny-chat': `messages` ends with an"):
        generate_job(prefilled, runtime)


def test_an_end_of_turn_the_tokenizer_does_not_mark_special_stays_out_of_the_text(runtime, tmp_path):
    """A chat model whose end-of-turn token is an ordinary added token (not `special`) ends its turn there all
    the same, and the reply's text holds no `<|im_end|>` (it leaked into BLEU, lengths and answers)."""
    import json
    import shutil

    model = tmp_path / "plain-end-chat"
    shutil.copytree(CHAT, model)
    tokens = json.loads((model / "tokenizer.json").read_text())
    for added in tokens["added_tokens"]:
        added["special"] = added["content"] == "<|endoftext|>"
    (model / "tokenizer.json").write_text(json.dumps(tokens))
    config = json.loads((model / "tokenizer_config.json").read_text())
    del config["extra_special_tokens"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    for strategy, params in (("greedy", None), ("beam", {"num_beams": 2})):  # the decode loop and generate()
        _, records = generate_job(job(model, strategy, params, max_new=40, prompts=OPENINGS), runtime)
        ended = [r for r in records if r.stop_reason == "eos"]
        assert ended, strategy
        assert all(r.token_ids[-1] == 4097 for r in ended)  # <|im_end|>: the turn ended there
        assert not [r.text for r in records if "<|im" in r.text], strategy


def test_a_system_prompt_the_model_would_never_see_fails_the_job_in_one_line(lm, tiny_model):
    """`system` (or template variables) on a model fed raw prompts was dropped in silence; the worker refuses it,
    as validation does, for a job that skipped validation (a hub id)."""
    for spec, has in (
        (job(CHAT, chat=False, system=SYSTEM), "chat: false"),
        (job(tiny_model, system=SYSTEM), "no chat"),
    ):
        with pytest.raises(PermanentJobError, match=f"^model '[a-z-]+': `system` is set, but .*{has}"):
            chat.prompt_ids(lm.tokenizer if spec.model.chat is False else _tokenizer(tiny_model), spec)


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_a_turn_ends_at_the_templates_end_of_turn_where_the_generation_config_omits_it(runtime, lm, tmp_path):
    """A checkpoint whose generation_config.json lists only the tokenizer's EOS (a fine-tune that kept its base
    model's) still ends its reply at the template's <|im_end|>: the reply ran on into turns the model made up
    ("system\\nYou continue ..."), its markup stripped from a text that read as one reply."""
    import json
    import shutil

    model = tmp_path / "eos-only-chat"
    shutil.copytree(CHAT, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": 0}))
    for strategy, params in (("greedy", None), ("beam", {"num_beams": 2})):  # the decode loop and generate()
        result, records = generate_job(job(model, strategy, params, max_new=40, prompts=OPENINGS), runtime)
        assert 4097 in result.generation_config["eos_token_id"], strategy
        assert not [r.token_ids for r in records if 4096 in r.token_ids], strategy  # no <|im_start|>: no new turn
        assert [r for r in records if r.stop_reason == "eos" and r.token_ids[-1] == 4097], strategy
    assert chat.turn_end(lm.tokenizer) == 4097  # <|im_end|>, what the template writes after a reply


def test_a_template_that_closes_a_turn_with_plain_text_adds_no_stop(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(CHAT)
    tok.chat_template = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n\n{% endfor %}### assistant:"
    assert chat.turn_end(tok) is None
    tok.chat_template = "{{ raise_exception('no') }}"
    assert chat.turn_end(tok) is None


def test_the_chat_record_names_the_prompts_whose_own_system_turn_took_the_models_place(runtime, lm):
    """engine.chat.system recorded the model's system prompt for every prompt, also those whose own system turn the
    template rendered in its place."""
    from worker.engine.chat import chat_record

    spec = chat_job(system=SYSTEM)
    own = PromptItem(id="own", prompt="Hi", messages=[ChatMessage(role="system", content="Be terse."),
                                                      ChatMessage(role="user", content="Hi")])  # fmt: skip
    spec = spec.model_copy(update={"prompts": [*spec.prompts, own]})
    record = chat_record(lm.tokenizer, spec, plan_job(spec, runtime, lm)[0].prompt_ids)
    assert record["system"] == SYSTEM and record["own_system"] == ["own"]
