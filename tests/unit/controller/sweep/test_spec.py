"""The sweep spec: valid examples load; every bad input is one line naming the field, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.sweep.load import load_spec
from controller.sweep.prompts import load_prompts
from tests.support.repo import REPO
from worker.core.errors import UsageError

pytestmark = pytest.mark.pure


GOOD = """
name: t
models:
  - path: MODEL
prompts:
  inline: ["Once upon a time", {id: b, prompt: "It was", reference: "a dark night"}]
strategies:
  - name: greedy
  - name: top_p
    params: {p: [0.8, 0.95]}
generation:
  max_new_tokens: 8
"""


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    (tmp_path / "config.json").write_text("{}")  # tmp_path is the spec's local model directory
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_examples_validate(example):
    spec = load_spec(example)
    assert spec.models and spec.strategies
    assert load_prompts(spec.prompts)


def test_good_spec_and_prompt_ids(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.replace("MODEL", str(tmp_path))))
    items = load_prompts(spec.prompts)
    assert [i.id for i in items] == ["p00000", "b"]
    assert items[1].reference == "a dark night"
    assert Path(spec.models[0].path) == tmp_path.resolve()


def test_jsonl_and_csv_prompt_files(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"id": "x", "prompt": "A", "reference": "B"}\n\n{"prompt": "C"}\n')
    (tmp_path / "p.csv").write_text("id,prompt,reference\nx,A,B\ny,C,\n")
    for name in ("p.jsonl", "p.csv"):
        spec = load_spec(
            write(
                tmp_path,
                GOOD.replace("MODEL", str(tmp_path)).replace(
                    'inline: ["Once upon a time", {id: b, prompt: "It was", reference: "a dark night"}]',
                    f"path: {name}",
                ),
            )
        )
        items = load_prompts(spec.prompts)
        assert [(i.prompt, i.reference) for i in items] == [("A", "B"), ("C", None)]


BAD = [
    ("unknown key", "models", "bogus: 1\n", "bogus: unknown key"),
    (
        "wrong type",
        "generation:\n  max_new_tokens: 8",
        "generation:\n  max_new_tokens: lots",
        "generation.max_new_tokens",
    ),
    (
        "unknown strategy",
        "  - name: greedy",
        "  - name: gredy",
        "strategies[0]: unknown strategy 'gredy'; did you mean 'greedy'?",
    ),
    (
        "negative max_new_tokens",
        "max_new_tokens: 8",
        "max_new_tokens: -3",
        "generation.max_new_tokens: Input should be greater than or equal to 1",
    ),
    ("bad param value", "p: [0.8, 0.95]", "p: [0.8, 1.5]", "strategies[1]: params.p must be <= 1.0"),
    ("unknown param", "p: [0.8, 0.95]", "q: 3", "strategies[1]: params.q: unknown parameter for 'top_p'"),
    ("empty model list", "models:\n  - path: MODEL", "models: []", "models: List should have at least 1 item"),
    (
        "missing prompt file",
        'inline: ["Once upon a time", {id: b, prompt: "It was", reference: "a dark night"}]',
        "path: nope.jsonl",
        "prompts.path: file 'nope.jsonl' does not exist",
    ),
    (
        "prompt path a directory",
        'inline: ["Once upon a time", {id: b, prompt: "It was", reference: "a dark night"}]',
        "path: .",
        "prompts.path: file '.' is a directory, not a file",
    ),
    ("malformed YAML", "name: t", "name: [t", "malformed YAML"),
    ("missing model dir", "path: MODEL", "path: ./no-such-model", "local model path './no-such-model' does not exist"),
    (
        "model name with the cell key's separator",
        "path: MODEL",
        'path: MODEL\n    name: "llama::8b"',
        "models[0]: label 'llama::8b' holds '::', which separates a cell key's parts",
    ),
]


@pytest.mark.parametrize("case,old,new,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_spec_is_one_line_exit_2_and_writes_nothing(tmp_path, case, old, new, expected):
    if old == "models":  # append a key
        text = GOOD.replace("MODEL", str(tmp_path)) + new
    else:
        assert old in GOOD, old
        text = GOOD.replace(old, new).replace("MODEL", str(tmp_path))
    spec = write(tmp_path, text)
    out = tmp_path / "runs"
    for command in (["validate", str(spec)], ["run", str(spec), "--out", str(out)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, (case, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
        assert not out.exists()


def test_schema_is_generated_from_the_models():
    result = CliRunner().invoke(main, ["validate", "--schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["additionalProperties"] is False
    assert {"name", "models", "prompts", "strategies"} <= set(schema["required"])
    assert "description" in schema["properties"]["models"]


def test_strategy_model_paths_resolve_against_the_spec(tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    text = GOOD.replace("MODEL", str(tmp_path)).replace(
        "  - name: greedy\n", "  - name: assisted\n    params: {assistant: ./draft}\n"
    )
    spec = load_spec(write(tmp_path, text))
    assert spec.strategies[0].params["assistant"] == str((tmp_path / "draft").resolve())


@pytest.mark.parametrize(
    "params,expected",
    [
        ("{assistant: ./missing}", "strategies[0].params.assistant: local model path './missing' does not exist"),
        ("{num_assistant_tokens: 3}", "strategies[0]: params.assistant is required for strategy 'assisted'"),
        ("{assistant: x, schedule: fast}", "params.schedule must be one of constant, heuristic"),
    ],
)
def test_assisted_strategy_errors(tmp_path, params, expected):
    text = GOOD.replace("MODEL", str(tmp_path)).replace(
        "  - name: greedy\n", f"  - name: assisted\n    params: {params}\n"
    )
    result = CliRunner().invoke(main, ["validate", str(write(tmp_path, text))])
    assert result.exit_code == 2 and expected in result.output, result.output


def test_e_notation_without_a_dot_is_a_number_as_in_json(tmp_path):
    """`epsilon: 3e-4` (the value docs/sweeps.md shows) was the text '3e-4' under YAML 1.1's rules, refused as
    "params.epsilon must be a number, got '3e-4'"; the same spec as JSON had it as a number. Now both agree."""
    text = GOOD.replace("MODEL", str(tmp_path)).replace(
        "  - name: greedy\n", "  - name: epsilon\n    params: {epsilon: 3e-4, temperature: [1E-5, 2e0]}\n"
    )
    spec = load_spec(write(tmp_path, text))
    assert spec.strategies[0].params == {"epsilon": 3e-4, "temperature": [1e-5, 2.0]}
    with pytest.raises(UsageError, match=r"params.epsilon must be a number, got '3e-4'"):  # text where quoted
        load_spec(write(tmp_path, text.replace("{epsilon: 3e-4", "{epsilon: '3e-4'"), "quoted.yaml"))
