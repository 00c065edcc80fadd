"""Input that used to pass with a silent loss or a raw pydantic error: an unterminated CSV quote, a CSV column or a
YAML/JSON key named twice, an empty stop string, booleans and strings for integers, inline prompt objects, a
conversation without a user turn, and errors that named the wrong line. Each is one line naming the file and
the line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.sweep.load import load_spec
from controller.sweep.prompts import load_prompts
from tests.support.cli import refused
from tests.support.repo import REPO
from worker.core.chat import chat_refusal
from worker.core.contract import ModelSpec, PromptItem

pytestmark = pytest.mark.pure

TINY = REPO / "examples" / "models" / "austen-tiny"
CHAT = REPO / "examples" / "models" / "austen-tiny-chat"

SPEC = f"""name: t
models:
  - path: {CHAT}
prompts:
  inline: ["It was"]
strategies:
  - name: greedy
generation:
  max_new_tokens: 4
"""


def validate(path: Path):
    return CliRunner().invoke(main, ["validate", str(path)])


def spec_with(tmp_path: Path, old: str, new: str) -> Path:
    assert old in SPEC, old
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.replace(old, new, 1))
    return path


def prompt_file(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return spec_with(tmp_path, 'inline: ["It was"]', f"path: {name}")


# -- prompt files ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('prompt,reference\nfirst,r1\n"oops,r2\nthird,r3\n', "p.csv:3: a quoted field opened on this line is never"),
        ('prompt,reference\na,"one\ntwo"\nb,"r3\n\nmore', "p.csv:4: a quoted field opened on this line"),
        ('"prompt,reference\na,b\n', "p.csv:1: a quoted field opened on this line"),
        ("prompt,prompt\na,b\n", "p.csv:1: the header names the column 'prompt' twice"),
    ],
    ids=["unterminated", "after-a-multiline-field", "in-the-header", "duplicate-column"],
)
def test_a_csv_that_would_lose_rows_or_a_column_is_refused(tmp_path, text, expected):
    refused(validate(prompt_file(tmp_path, "p.csv", text)), expected)


def test_a_multiline_quoted_csv_field_still_reads(tmp_path):
    items = load_prompts(load_spec(prompt_file(tmp_path, "p.csv", 'prompt,reference\na,"one\ntwo"\n')).prompts)
    assert [(i.prompt, i.reference) for i in items] == [("a", "one\ntwo")]


def test_a_jsonl_key_given_twice_is_refused(tmp_path):
    path = prompt_file(tmp_path, "p.jsonl", '{"prompt": "a"}\n{"prompt": "b", "prompt": "c"}\n')
    refused(validate(path), "p.jsonl:2: the key 'prompt' is given twice")


def test_jsonl_gold_numbers_keep_their_digits_in_positional_notation(tmp_path):
    lines = ['{"prompt": "a", "answer": 1e16}', '{"prompt": "b", "answer": [0.00001, 4.50, 7]}']
    items = load_prompts(load_spec(prompt_file(tmp_path, "p.jsonl", "\n".join(lines))).prompts)
    assert [i.answer for i in items] == [["10000000000000000"], ["0.00001", "4.5", "7"]]  # 4.5: as before (ids)
    refused(validate(prompt_file(tmp_path, "p.jsonl", '{"prompt": 4.5}\n')), "`prompt` must be a string, got float")


def test_prompt_with_messages_but_no_user_turn_is_refused(tmp_path):
    line = {"id": "x", "prompt": "Emma ...", "messages": [{"role": "system", "content": "Be brief."}]}
    line = refused(validate(prompt_file(tmp_path, "p.jsonl", json.dumps(line) + "\n")), "p.jsonl:1: `messages`")
    assert "a conversation needs one (put the prompt in a user message)" in line
    # and by the worker's rules, for a job built elsewhere
    item = PromptItem(id="x", prompt="Emma", messages=[{"role": "system", "content": "Be brief."}])
    assert "no user turn" in chat_refusal(ModelSpec(path="m", chat=True), True, item)
    assert chat_refusal(ModelSpec(path="m", chat=False), True, item) is None  # the raw prompt: it is seen


# -- the sweep file ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("strategies:\n", "strategies:\n  - name: greedy\nstrategies:\n", "spec.yaml:8: malformed YAML (column 1): "
         "the key 'strategies' is given twice (first on line 6)"),
        ("  - name: greedy\n", "  - name: top_p\n    params: {p: 0.5, p: 0.9}\n", "spec.yaml:8: malformed YAML "
         "(column 22): the key 'p' is given twice"),
        ("max_new_tokens: 4", 'max_new_tokens: 4\n  stop: ["x", ""]', "spec.yaml:10: generation.stop: stop[1] is "
         "empty"),
        ("max_new_tokens: 4", "max_new_tokens: true", "spec.yaml:9: generation.max_new_tokens: must be an integer, "
         "got bool"),
        ("max_new_tokens: 4", 'max_new_tokens: "12"', "generation.max_new_tokens: must be an integer, got '12'"),
        ("max_new_tokens: 4", "max_new_tokens: 4\n  seeds: [true]", "generation.seeds[0]: must be an integer"),
        ("max_new_tokens: 4", 'max_new_tokens: 4\n  seeds: ["1"]', "generation.seeds[0]: must be an integer"),
        ("max_new_tokens: 4", "max_new_tokens: 4\n  batch_size: true", "batch_size: must be an integer or 'auto'"),
        ("prompts:\n", "prompts:\n  limit: true\n", "spec.yaml:5: prompts.limit: must be an integer, got bool"),
        ("max_new_tokens: 4", "max_new_tokens: 4\n  min_new_tokens: 9", "spec.yaml:10: generation.min_new_tokens: "
         "must not exceed max_new_tokens"),
        ("max_new_tokens: 4", "max_new_tokens: 4\n  seeds: [1, 2,\n    1]", "spec.yaml:11: generation.seeds[2]: "
         "seeds must be distinct"),
        ("max_new_tokens: 4", "max_new_tokens: 4\nmetrics:\n  - exact_match\n  - pass@7", "spec.yaml:12: "
         "metrics[1]: pass@7 needs 7 generations"),
        ("max_new_tokens: 4", "max_new_tokens: 4\nmetrics: [pass@0]", "unknown metric 'pass@0' (valid: answered, "),
    ],
    ids=["strategies-twice", "param-twice", "empty-stop", "bool-tokens", "string-tokens", "bool-seed", "string-seed",
         "bool-batch", "bool-limit", "min-over-max", "seed-twice", "pass@k-line", "unknown-metric"],
)  # fmt: skip
def test_bad_sweep_input_is_one_line_naming_its_line(tmp_path, old, new, expected):
    refused(validate(spec_with(tmp_path, old, new)), expected)


def test_a_grid_over_the_job_limit_counts_its_variants_and_jobs_in_words(tmp_path):
    """The counts' words follow them (`plural`): it said "the grid has 1 variants, so at least 1 jobs"."""
    from controller.sweep.wording import plural

    grid = spec_with(tmp_path, "  - name: greedy", "  - name: top_p\n    params: {p: [0.8, 0.9]}")
    result = CliRunner().invoke(main, ["validate", str(grid)], env={"DECODEBENCH_MAX_JOBS": "1"})
    refused(result, "the grid has 2 variants, so at least 2 jobs, over the limit of 1")
    assert (plural(1, "variant"), plural(2, "job"), plural(0, "job")) == ("variant", "jobs", "jobs")


def test_stored_specs_with_integers_still_load(tmp_path):
    spec = load_spec(spec_with(tmp_path, "max_new_tokens: 4", "max_new_tokens: 4\n  seeds: [1, 2]\n  batch_size: 3"))
    again = type(spec).model_validate_json(spec.model_dump_json())
    assert again.generation.seeds == [1, 2] and again.generation.batch_size == 3


# -- inline prompts ---------------------------------------------------------------------------------

INLINE = """
    - "plain"
    - {prompt: "It was", reference: "a truth"}
    - {id: q, system: "Be brief.", prompt: "Emma"}
    - messages: [{role: user, content: "Hi"}]
    - {prompt: "1+1=?", answer: 2, choices: ["2", "3"]}"""


def test_inline_objects_take_a_prompt_files_fields_and_its_ids(tmp_path):
    spec = load_spec(spec_with(tmp_path, ' ["It was"]', INLINE))
    items = load_prompts(spec.prompts)
    assert [i.id for i in items] == ["p00000", "p00001", "q", "p00003", "p00004"]
    assert items[1].reference == "a truth" and items[3].prompt == "Hi" and items[4].answer == ["2"]
    assert [m.role for m in items[2].messages] == ["system", "user"]
    assert load_prompts(type(spec).model_validate_json(spec.model_dump_json()).prompts) == items  # as stored


@pytest.mark.parametrize(
    "entry, expected",
    [
        ("{prompt: x, messages: [{role: wizard, content: hi}]}", "messages[0]: unknown role 'wizard'"),
        ("5", "an item must be an object with `prompt` or a string, got int"),
        ("{prompt: x, bogus: 1}", "unknown field 'bogus'"),
        ("{messages: [{role: system, content: x}]}", "`messages` has no user turn"),
        ("{prompt: x, system: 3}", "`system` must be a string, got int"),
    ],
    ids=["role", "int", "unknown-field", "no-user-turn", "system-type"],
)
def test_a_bad_inline_prompt_names_its_line_in_the_spec(tmp_path, entry, expected):
    line = refused(validate(spec_with(tmp_path, ' ["It was"]', f'\n    - "fine"\n    - {entry}')), expected)
    assert "spec.yaml:7: prompts.inline[1]: " in line and "Input should be" not in line
