"""Hostile input (issue 14): one regression test per class of bad file, path, number or size
that once escaped as a traceback or ran without bound. Each answer is one line on stderr,
exit 2, naming the file and where in it."""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from tests.support.cli import refused
from tests.support.services import PROMPTS, TINY_MODEL

pytestmark = pytest.mark.pure

BASE = f"""name: hostile
models:
  - path: {TINY_MODEL}
prompts:
  path: {PROMPTS}
  limit: 4
  shard_size: 2
strategies:
  - name: greedy
  - name: top_p
    params: {{p: 0.9}}
  - name: top_k
    params: {{k: 40}}
generation:
  max_new_tokens: 8
  seeds: [0, 1]
"""


def validate(path: Path | str, *args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, [*args, "validate", str(path)], env=env)


def spec_with(tmp_path: Path, old: str, new: str, name: str = "sweep.yaml") -> Path:
    assert old in BASE, old
    path = tmp_path / name
    path.write_text(BASE.replace(old, new, 1))
    return path


def prompt_spec(tmp_path: Path, data: bytes, name: str = "p.jsonl") -> Path:
    (tmp_path / name).write_bytes(data)
    return spec_with(tmp_path, f"path: {PROMPTS}", f"path: {name}")


# -- the sweep file ------------------------------------------------------------------------


def test_the_base_spec_is_valid_and_validate_states_the_job_limit(tmp_path):
    result = validate(spec_with(tmp_path, "name: hostile", "name: hostile"))
    assert result.exit_code == 0, result.output
    assert "limit: 100,000 jobs per sweep (DECODEBENCH_MAX_JOBS)" in result.output


@pytest.mark.parametrize(
    "content",
    [b"name: caf\xe9\n", codecs.BOM_UTF16_LE + "name: x\n".encode("utf-16-le")],
    ids=["latin1", "utf16"],
)
def test_unicode_decode_error_in_the_sweep_file(tmp_path, content):
    (tmp_path / "s.yaml").write_bytes(content)
    refused(validate(tmp_path / "s.yaml"), "s.yaml: not UTF-8 text (byte ", "must be UTF-8")


@pytest.mark.parametrize(
    "value,expected",
    [
        ("2024-02-30", "'2024-02-30' is not a valid date or time"),  # ValueError
        ("0x_", "'0x_' is not an integer"),  # ValueError
        ("!!int abc", "'abc' is not an integer"),  # ValueError
        ("!!int ''", "'' is not an integer"),  # IndexError
        ("!!bool maybe", "'maybe' is not true or false"),  # KeyError
        ("!!timestamp nope", "'nope' is not a valid date or time"),  # AttributeError
        ("!!int " + "9" * 5000, "is not an integer"),  # ValueError: over Python's 4300 digits
    ],
    ids=[
        "value-error-date",
        "value-error-0x",
        "value-error-int-tag",
        "index-error",
        "key-error",
        "attribute-error",
        "value-error-digits",
    ],
)
def test_scalar_constructor_errors_are_yaml_errors_with_their_line(tmp_path, value, expected):
    line = refused(validate(spec_with(tmp_path, "name: hostile", f"name: {value}")), expected)
    assert "sweep.yaml:1: malformed YAML (column 7)" in line


def test_recursion_error_from_nested_brackets(tmp_path):
    refused(validate(spec_with(tmp_path, "name: hostile", "name: " + "[" * 1000 + "]" * 1000)), "sweep.yaml:1:")


def test_nesting_deeper_than_the_limit_is_refused_before_construction(tmp_path):
    refused(validate(spec_with(tmp_path, "name: hostile", "name: " + "[" * 80 + "]" * 80)), "nested deeper than 64")


def test_os_error_from_a_long_spec_file_name(tmp_path):
    refused(validate(tmp_path / ("x" * 300 + ".yaml")), "cannot read the spec file (File name too long)")


def test_value_error_from_a_nul_byte_in_the_spec_file_name(tmp_path):
    refused(validate(str(tmp_path) + "/a\0b.yaml"), "a\\x00b.yaml': no such spec file")


def test_a_spec_file_over_its_size_limit(tmp_path):
    path = spec_with(tmp_path, "name: hostile", "name: hostile\ndescription: " + "x" * 5000)
    refused(validate(path, env={"DECODEBENCH_SPEC_MAX_KB": "4"}), "over the limit of 4 KiB (DECODEBENCH_SPEC_MAX_KB)")


def test_control_characters_are_a_yaml_error_with_the_line(tmp_path):
    refused(validate(spec_with(tmp_path, "name: hostile", "name: a\x01b")), "sweep.yaml:1: malformed YAML", "'\\x01'")


# -- paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where,old",
    [("models[0].path", f"path: {TINY_MODEL}"), ("prompts.path", f"path: {PROMPTS}")],
    ids=["model", "prompts"],
)
@pytest.mark.parametrize(
    "path,expected",
    [
        ("./" + "x" * 300, "(File name too long)"),  # OSError
        ("~nosuchuser/m", "no such user's home directory"),  # RuntimeError
        ('"./a\\0b"', "(embedded null byte)"),  # ValueError
        ("./loop", "cannot be resolved (Symlink loop"),  # RuntimeError while building the message
    ],
    ids=["os-error-long-name", "runtime-error-home", "value-error-nul", "runtime-error-symlink-loop"],
)
def test_path_errors(tmp_path, where, old, path, expected):
    os.symlink("loop", tmp_path / "loop")
    line = refused(validate(spec_with(tmp_path, old, f"path: {path}")), f"{where}: ", expected)
    assert line.startswith(f"error: {tmp_path}/sweep.yaml:")


def test_a_model_path_that_is_a_plain_file_is_refused(tmp_path):
    refused(validate(spec_with(tmp_path, f"path: {TINY_MODEL}", "path: /etc/passwd")), "is not a directory")


def test_a_model_directory_without_config_json_is_refused(tmp_path):
    (tmp_path / "m").mkdir()
    refused(validate(spec_with(tmp_path, f"path: {TINY_MODEL}", "path: ./m")), "models[0].path", "has no config.json")


def test_a_hub_id_stays_allowed_and_a_malformed_one_is_refused(tmp_path):
    assert validate(spec_with(tmp_path, f"path: {TINY_MODEL}", "path: org/model-a")).exit_code == 0
    refused(validate(spec_with(tmp_path, f"path: {TINY_MODEL}", "path: 'a b'")), "neither a local directory nor a hub")


# -- numbers and cross-field rules -----------------------------------------------------------


@pytest.mark.parametrize(
    "old,new,expected",
    [
        ("{k: 40}", "{k: .inf}", "strategies[2]: params.k must be a finite number, got inf"),  # OverflowError
        ("{k: 40}", "{k: " + "9" * 60 + "}", "params.k must be between"),  # past a C int
        ("{p: 0.9}", "{p: " + "9" * 400 + "}", "params.p is too large for a number"),  # OverflowError
        ("{p: 0.9}", "{p: .nan}", "params.p must be a finite number, got nan"),
        ("max_new_tokens: 8", "max_new_tokens: " + "1" + "0" * 60, "generation.max_new_tokens: Input should be less"),
        ("seeds: [0, 1]", "seeds: [0, " + "1" + "0" * 30 + "]", "generation.seeds[1]: Input should be less"),
        ("max_new_tokens: 8", "max_new_tokens: 8\n  batch_size: 100000000", "generation.batch_size"),
    ],
    ids=["overflow-inf-int", "huge-int", "overflow-float", "nan", "max-new-tokens", "seed", "batch-size"],
)
def test_numbers_past_what_the_backend_takes(tmp_path, old, new, expected):
    refused(validate(spec_with(tmp_path, old, new)), expected)


def test_cross_field_rule_names_the_strategy_entry(tmp_path):
    path = spec_with(
        tmp_path,
        "  - name: greedy\n",
        "  - name: greedy\n  - name: diverse_beam\n    params: {num_beams: [4, 5], num_beam_groups: 2}\n",
    )
    line = refused(validate(path), "strategies[1] (diverse_beam): num_beams (5) must be divisible by num_beam_groups")
    assert "sweep.yaml:10:" in line


# -- prompt files ----------------------------------------------------------------------------


def test_unicode_decode_error_in_a_prompt_file_names_the_byte(tmp_path):
    refused(
        validate(prompt_spec(tmp_path, b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')), "p.jsonl: not UTF-8", "byte 32"
    )


def test_a_prompt_file_in_utf16_without_bom_is_refused_naming_the_byte(tmp_path):
    refused(validate(prompt_spec(tmp_path, '{"prompt": "a"}\n'.encode("utf-16-le"))), "NUL byte at byte 1")


@pytest.mark.parametrize(
    "encode",
    [
        lambda t: codecs.BOM_UTF8 + t.encode(),
        lambda t: codecs.BOM_UTF16_LE + t.encode("utf-16-le"),
        lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be"),
    ],
    ids=["utf8-bom", "utf16-le-bom", "utf16-be-bom"],
)
@pytest.mark.parametrize("name", ["p.jsonl", "p.csv"])
def test_spreadsheet_encodings_are_read(tmp_path, encode, name):
    from controller.sweep.load import load_spec
    from controller.sweep.prompts import load_prompts

    text = '{"id": "x", "prompt": "Émile — ünïcode"}\r\n' if name == "p.jsonl" else "id,prompt\r\nx,Émile — ünïcode\r\n"
    items = load_prompts(load_spec(prompt_spec(tmp_path, encode(text), name)).prompts)
    assert [(i.id, i.prompt) for i in items] == [("x", "Émile — ünïcode")]


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"])
def test_a_jsonl_line_with_a_unicode_line_separator_parses(tmp_path, char):
    from controller.sweep.load import load_spec
    from controller.sweep.prompts import load_prompts

    data = (json.dumps({"prompt": f"a{char}b"}, ensure_ascii=False) + "\n").encode()
    assert [i.prompt for i in load_prompts(load_spec(prompt_spec(tmp_path, data)).prompts)] == [f"a{char}b"]


def test_csv_error_a_field_over_the_field_size_limit(tmp_path):
    data = b"prompt\n" + b"x" * 2000 + b"\n"
    result = validate(prompt_spec(tmp_path, data, "p.csv"), env={"DECODEBENCH_PROMPT_LINE_MAX_CHARS": "1000"})
    refused(result, "p.csv:", "longer than 1,000 characters (DECODEBENCH_PROMPT_LINE_MAX_CHARS)")


def test_type_error_a_csv_row_longer_than_its_header(tmp_path):
    refused(validate(prompt_spec(tmp_path, b"prompt,reference\na,b,c\n", "p.csv")), "p.csv:2: row 1: 3 fields")


def test_recursion_error_a_deeply_nested_jsonl_line(tmp_path):
    data = b'{"prompt": "a"}\n{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    refused(validate(prompt_spec(tmp_path, data)), "p.jsonl:2: the JSON is nested too deeply")


@pytest.mark.parametrize(
    "line,expected",
    [
        ('{"prompt": 5}', "p.jsonl:1: `prompt` must be a string, got int"),
        ('{"prompt": "a", "reference": ["x"]}', "p.jsonl:1: `reference` must be a string or null, got list"),
        ('{"prompt": "a", "id": {"x": 1}}', "p.jsonl:1: `id` must be a string or an integer, got dict"),
        ('{"prompt": "a", "extra\\nkey": 1}', "unknown field 'extra\\nkey'"),
        ("[1, 2]", "an item must be an object with `prompt` or a string, got list"),
        ('{"prompt": 1' + "0" * 5000 + "}", "p.jsonl:1: not valid JSON"),
    ],
    ids=["prompt-int", "reference-list", "id-dict", "key-with-newline", "not-an-object", "int-over-4300-digits"],
)
def test_validation_error_of_a_prompt_line_is_one_line(tmp_path, line, expected):
    refused(validate(prompt_spec(tmp_path, line.encode() + b"\n")), expected)


def test_a_prompt_file_over_its_size_limit_and_a_line_over_its_length_limit(tmp_path):
    path = prompt_spec(tmp_path, b'{"prompt": "' + b"x" * (2 << 20) + b'"}\n')
    refused(validate(path, env={"DECODEBENCH_PROMPT_FILE_MAX_MB": "1"}), "over the limit of 1 MiB")
    refused(validate(path, env={"DECODEBENCH_PROMPT_LINE_MAX_CHARS": "1000"}), "p.jsonl:1: a line longer than 1,000")


# -- size ------------------------------------------------------------------------------------


def test_a_grid_of_160k_variants_is_refused_before_expansion(tmp_path):
    path = spec_with(tmp_path, "{p: 0.9}", "{p: [" + ",".join(["1"] * 160_000) + "]}")  # 320 kB
    refused(
        validate(path, env={"DECODEBENCH_SPEC_MAX_KB": "400"}),
        "strategies[1].params: the grid has 160,000 variants",
        "(DECODEBENCH_MAX_JOBS)",
    )


def test_a_million_invalid_list_items_are_refused_by_the_file_size(tmp_path):
    path = spec_with(tmp_path, "{p: 0.9}", "{p: [" + ", ".join(["x"] * 1_000_000) + "]}")
    refused(validate(path), "over the limit of 256 KiB (DECODEBENCH_SPEC_MAX_KB)")


def test_50000_prompts_with_shard_size_1_are_refused_by_the_job_count(tmp_path):
    data = "".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(50_000)).encode()
    path = prompt_spec(tmp_path, data)
    path.write_text(path.read_text().replace("  limit: 4\n  shard_size: 2", "  shard_size: 1"))
    refused(validate(path), "up to 250,000 jobs, over the limit of 100,000 (DECODEBENCH_MAX_JOBS)")
    refused(validate(path, env={"DECODEBENCH_MAX_JOBS": "1000"}), "over the limit of 1,000 (DECODEBENCH_MAX_JOBS)")


# -- messages --------------------------------------------------------------------------------


def test_an_alias_bomb_gives_one_short_line(tmp_path):
    bomb = "{p: &a [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], temperature: &b [*a, *a, *a, *a, *a]}"
    refused(validate(spec_with(tmp_path, "{p: 0.9}", bomb)), "params.temperature must be a number, got [0.5, 0.5")
    levels = ["l0: &l0 [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]"]
    levels += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = spec_with(tmp_path, "name: hostile", "name: hostile\nanchors:\n  " + "\n  ".join(levels))
    refused(validate(path), "expands to more than 1,000,000 values")


def test_a_key_with_newlines_gives_one_line(tmp_path):
    refused(validate(spec_with(tmp_path, "name: hostile", 'name: hostile\n"a\\nb\\nc": 1')), "'a\\nb\\nc': unknown key")


def test_debug_prints_the_traceback_too(tmp_path):
    path = spec_with(tmp_path, "{p: 0.9}", "{p: .nan}")
    for result in (validate(path, "--debug"), validate(path, env={"DECODEBENCH_DEBUG": "1"})):
        assert result.exit_code == 2 and "Traceback" in result.stderr
        assert result.stderr.splitlines()[-1].startswith("error: ") and "finite" in result.stderr
