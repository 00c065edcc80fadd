"""Chat models in a sweep (issue 38, part 1): `messages` and `system` in prompt files, a model's `chat`,
`system` and `chat_template_kwargs`, and every bad input as one line naming the prompt and the model, exit 2,
at validation (`decodebench validate`, `run`). Reads the bundled chat model's tokenizer files only: no
weights, no torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.sweep.load import load_spec, parse_spec
from controller.sweep.plan import plan
from controller.sweep.prompts import load_prompts
from tests.support.repo import REPO
from worker.core.contract import JobSpec, PromptItem

pytestmark = pytest.mark.pure

CHAT = REPO / "examples" / "models" / "austen-tiny-chat"
TINY = REPO / "examples" / "models" / "austen-tiny"


def spec_file(tmp_path: Path, prompts: list, model: dict | None = None, suffix: str = ".jsonl") -> Path:
    """A sweep over `prompts` (written as JSONL, or as CSV text) on `model` (default: the chat model)."""
    file = tmp_path / f"prompts{suffix}"
    if suffix == ".csv":
        file.write_text(prompts)
    else:
        file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    spec = {
        "name": "chat",
        "models": [model or {"path": str(CHAT)}],
        "prompts": {"path": file.name},
        "strategies": [{"name": "greedy"}],
        "generation": {"max_new_tokens": 4},
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def validate(path: Path):
    return CliRunner().invoke(main, ["validate", str(path)])


def test_messages_and_a_system_column_load_as_conversations(tmp_path):
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Anne was"}]
    items = load_prompts(load_spec(spec_file(tmp_path, [{"id": "a", "messages": turns}])).prompts)
    assert [m.model_dump() for m in items[0].messages] == turns and items[0].prompt == "Anne was"
    csv = "id,system,prompt,reference\nb,Be brief.,Anne was,a girl\nc,,She said,\n"
    items = load_prompts(load_spec(spec_file(tmp_path, csv, suffix=".csv")).prompts)
    assert [m.model_dump() for m in items[0].messages] == turns and items[0].reference == "a girl"
    assert items[1].messages is None and items[1].prompt == "She said"
    res = validate(spec_file(tmp_path, csv, {"path": str(TINY)}, suffix=".csv"))  # no template: named as given
    assert (
        res.exit_code == 2
        and "prompt 'b', model 'austen-tiny': the prompt is a conversation (`messages`, or a "
        "`system` field), but the model's tokenizer has no chat template"
        in res.output
    ), res.output


def test_a_chat_sweep_validates_and_its_jobs_carry_the_conversation(tmp_path):
    turns = [{"role": "user", "content": "Anne was"}]
    model = {"path": str(CHAT), "system": "Be brief.", "chat_template_kwargs": {"style": "terse"}}
    path = spec_file(tmp_path, [{"id": "a", "messages": turns}, {"id": "b", "prompt": "He"}], model)
    res = validate(path)
    assert res.exit_code == 0, res.output
    job = plan(load_spec(path))[0]
    again = JobSpec.model_validate_json(job.model_dump_json())
    assert again == job and again.model.system == "Be brief." and again.prompts[0].messages[0].content == "Anne was"


def test_sweeps_and_jobs_without_chat_fields_keep_their_ids_and_payloads(tmp_path):
    """A spec without any chat field hashes, and its jobs serialise, as before chat models existed."""
    data = {
        "name": "t",
        "models": [{"path": str(TINY)}],
        "prompts": {"inline": ["Once", {"id": "b", "prompt": "It was", "reference": "dark"}]},
        "strategies": [{"name": "greedy"}],
    }
    job = plan(parse_spec(data))[0]
    dumped = job.model_dump(mode="json")
    assert set(dumped["model"]) == {"path", "name", "revision", "dtype", "trust_remote_code", "use_safetensors",
                                    "attention"}  # fmt: skip
    assert all(set(p) == {"id", "prompt", "reference"} for p in dumped["prompts"])
    chat = plan(parse_spec({**data, "models": [{"path": str(TINY), "chat": False}]}))[0]
    assert chat.sweep_id != job.sweep_id  # a chat field set is part of the sweep


@pytest.mark.parametrize(
    ("prompts", "model", "expected"),
    [
        (
            [{"id": "q1", "messages": [{"role": "user", "content": "Hi"}]}],
            {"path": str(TINY)},
            "prompt 'q1', model 'austen-tiny': the prompt is a conversation (`messages`, or a `system` field), but",
        ),
        (
            [{"id": "q1", "prompt": "Hi"}],
            {"path": str(TINY), "chat": True},
            "prompt 'q1', model 'austen-tiny': chat: true, but the model's tokenizer has no chat template",
        ),
        (
            [{"id": "q2", "messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Late"}]}],
            None,
            "prompt 'q2', model 'austen-tiny-chat': the chat template fails to render: the system turn must come first",
        ),
        (
            [{"id": "q3", "messages": [{"role": "bot", "content": "Hi"}]}],
            None,
            "prompts.jsonl:1: messages[0]: unknown role 'bot' (valid: system, user, assistant)",
        ),
        ([{"id": "q4", "messages": [], "prompt": "Hi"}], None, "prompts.jsonl:1: `messages` is an empty conversation"),
        (
            [{"id": "q5", "messages": [{"role": "user", "content": 3}]}],
            None,
            "prompts.jsonl:1: messages[0].content must be a string, got int",
        ),
        (
            [{"id": "q6", "prompt": "Hi"}],
            {"path": str(CHAT), "chat_template_kwargs": {"add_generation_prompt": False}},
            "'add_generation_prompt' cannot be a template variable",
        ),
        (
            [{"id": "q7", "prompt": "Hi"}],
            {"path": str(TINY), "system": "Answer in French."},
            "model 'austen-tiny': `system` is set, but its tokenizer has no chat template, so the model would never",
        ),
        (
            [{"id": "q8", "prompt": "Hi"}],
            {"path": str(CHAT), "chat": False, "chat_template_kwargs": {"enable_thinking": False}},
            "model 'austen-tiny-chat': `chat_template_kwargs` is set, but chat: false feeds it the raw prompt, so",
        ),
        (
            [{"id": "q9", "prompt": "Hi"}],
            {"path": "nobody/hub-model", "chat": False, "system": "Be brief."},
            "model 'hub-model': `system` is set, but chat: false feeds it the raw prompt, so the model would never",
        ),
        (
            [
                {
                    "id": "q10",
                    "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "It is"}],
                }
            ],
            None,
            "prompt 'q10', model 'austen-tiny-chat': `messages` ends with an assistant turn, which the template closes",
        ),
    ],
    ids=[
        "no-template",
        "chat-true",
        "fails-to-render",
        "unknown-role",
        "empty",
        "content-type",
        "reserved-kwarg",
        "system-without-template",
        "kwargs-with-chat-false",
        "hub-id-chat-false",
        "assistant-last",
    ],
)
def test_bad_chat_input_is_one_line_exit_2(tmp_path, prompts, model, expected):
    res = validate(spec_file(tmp_path, prompts, model))
    assert res.exit_code == 2, res.output
    assert expected in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert "Traceback" not in res.output


def test_a_template_that_does_not_compile_is_refused_at_validation(tmp_path):
    broken = tmp_path / "broken-chat"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (broken / name).write_bytes((CHAT / name).read_bytes())
    config = json.loads((CHAT / "tokenizer_config.json").read_text())
    (broken / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{% for m in messages %}"}))
    res = validate(spec_file(tmp_path, [{"id": "a", "prompt": "Hi"}], {"path": str(broken)}))
    assert res.exit_code == 2 and "model 'broken-chat': its chat template does not compile" in res.output, res.output


def test_chat_false_feeds_the_raw_prompt_even_with_messages(tmp_path):
    turns = [{"role": "user", "content": "Anne was"}]
    res = validate(spec_file(tmp_path, [{"id": "a", "messages": turns}], {"path": str(CHAT), "chat": False}))
    assert res.exit_code == 0, res.output


def test_an_empty_conversation_is_refused_by_the_contract():
    with pytest.raises(ValueError, match="an empty conversation"):
        PromptItem(id="a", prompt="x", messages=[])


def test_a_template_with_transformers_generation_tag_validates_and_renders_its_body(tmp_path):
    """`{% generation %}` (a training mask's marker, which apply_chat_template compiles) was refused as a template
    that does not compile."""
    from controller.sweep.chat import rendered_prompts
    from worker.core.contract import ModelSpec

    tagged = tmp_path / "tagged-chat"
    tagged.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (tagged / name).write_bytes((CHAT / name).read_bytes())
    config = json.loads((CHAT / "tokenizer_config.json").read_text())
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (tagged / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Go"},
    ]
    res = validate(spec_file(tmp_path, [{"id": "a", "messages": turns}], {"path": str(tagged)}))
    assert res.exit_code == 0, res.output
    item = PromptItem(id="a", prompt="Go", messages=turns)
    assert rendered_prompts(ModelSpec(path=str(tagged)), [item]) == [
        "<|im_start|>user\nHi<|im_end|><|im_start|>assistant\nYes.<|im_end|><|im_start|>user\nGo<|im_end|>"
        "<|im_start|>assistant\n"
    ]  # apply_chat_template's text: jinja's trim_blocks takes the newline after a block tag, as transformers sets it


def test_validate_show_prompt_prints_what_each_model_is_fed(tmp_path):
    """The rendered template (its newlines shown as escapes, one line), the model's system prompt first; the raw
    text for the same model with chat: false."""
    path = spec_file(tmp_path, [{"id": "a", "prompt": "Anne was"}], {"path": str(CHAT), "system": "Be brief."})
    spec = json.loads(path.read_text())
    spec["models"].append({"path": str(CHAT), "name": "raw", "chat": False})
    path.write_text(json.dumps(spec))
    res = CliRunner().invoke(main, ["validate", "--show-prompt", str(path)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    at = lines.index("prompt a as model austen-tiny-chat is fed it (its chat template):")
    assert lines[at + 1] == (
        "  <|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nAnne was<|im_end|>\\n<|im_start|>assistant\\n"
    )
    at = lines.index(
        "prompt a as model raw is fed it (the raw prompt text, tokenised with the tokenizer's special tokens):"
    )
    assert lines[at + 1] == "  Anne was"
