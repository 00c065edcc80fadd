"""Property-based hostile input (issue 14): the bundled example sweep and prompt file, mutated
in types, keys, numbers, Unicode and control characters, nesting, YAML anchors and aliases,
encodings and sizes. Every case ends in exit 0 or exit 2 with one line on stderr, never a
traceback. Deterministic (derandomized); HOSTILE_EXAMPLES=2000 runs more examples per test."""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.cli import main
from tests.support.repo import REPO
from tests.support.services import PROMPTS, TINY_MODEL

pytestmark = pytest.mark.pure

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)


def example_spec() -> dict:
    """examples/quickstart.yaml with its paths absolute and fewer prompts, as a dict."""
    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec["models"] = [{"path": str(TINY_MODEL)}, {"path": str(REPO / "examples" / "models" / "austen-small")}]
    spec["prompts"].update(path=str(PROMPTS), limit=8, shard_size=4)
    return spec


BASE = example_spec()
BASE_TEXT = yaml.safe_dump(BASE, sort_keys=False)
PROMPT_LINES = PROMPTS.read_text(encoding="utf-8").splitlines()[:6]

text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
odd_text = st.one_of(
    text,
    st.sampled_from(
        ["\n", "\r\n", "\x00", "\x85", "\u2028", "\ufeff", "\x1b[31m", "é" * 50, "~nosuchuser/x", "x" * 300]
    ),
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**80), max_value=10**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, 10**400, 1e308, -0.0]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, odd_text)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=3)),
    max_leaves=12,
)


def paths_of(obj, prefix=()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths_of(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths_of(v, (*prefix, i))
    return out


PATHS = paths_of(BASE)[1:]


def replaced(obj, path: tuple, value, key_instead: bool = False):
    """A deep copy of obj with the value (or, with key_instead, the key) at `path` replaced."""
    obj = json.loads(json.dumps(obj))
    parent = obj
    for part in path[:-1]:
        parent = parent[part]
    if key_instead and isinstance(parent, dict):
        parent[value if isinstance(value, str) else str(value)] = parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return obj


def check(result) -> None:
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert len(lines[0]) < 1000, lines[0]


def run_validate(tmp_path: Path, data: bytes, name: str = "sweep.yaml"):
    path = tmp_path / name
    path.write_bytes(data)
    return CliRunner().invoke(main, ["validate", str(path)])


@FUZZ
@given(path=st.sampled_from(PATHS), value=values, key_instead=st.booleans())
def test_a_value_or_key_of_the_example_sweep_replaced(tmp_path, path, value, key_instead):
    spec = replaced(BASE, path, value, key_instead)
    check(run_validate(tmp_path, yaml.safe_dump(spec, allow_unicode=True).encode()))


ALIASES = [
    "x: &a [1, 2, 3]\ny: [*a, *a, *a]\n",
    "x: &a {p: 0.5}\ny: *a\n",
    "x: &a [*a]\n",
    "x: *undefined\n",
    "<<: &a {name: n}\n",
    "x: &a ["
    + ", ".join(["1"] * 10)
    + "]\ny: &b ["
    + ", ".join(["*a"] * 10)
    + "]\nz: ["
    + ", ".join(["*b"] * 10)
    + "]\n",
    "!!python/object:os.system x\n",
    "--- a\n--- b\n",
    "[" * 200 + "]" * 200 + "\n",
    "{" * 70 + "}" * 70 + "\n",
    "%YAML 1.1\n---\n",
    "? [1, 2]\n: 3\n",
    "x: !!binary '###'\n",
    "x: !!set {a, b}\n",
    "x: !!float 1e999999\n",
    "x: !!omap [a]\n",
]


@FUZZ
@given(
    position=st.integers(min_value=0, max_value=len(BASE_TEXT)),
    cut=st.integers(min_value=0, max_value=40),
    insert=st.one_of(odd_text, st.sampled_from(ALIASES), st.binary(max_size=12).map(lambda b: b.decode("latin-1"))),
    encoding=st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-16", "latin-1", "utf-8-sig", "cp1252"]),
    times=st.sampled_from([1, 1, 1, 3, 2000]),
)
def test_the_example_sweep_text_edited(tmp_path, position, cut, insert, encoding, times):
    edited = BASE_TEXT[:position] + insert * times + BASE_TEXT[position + cut :]
    check(run_validate(tmp_path, edited.encode(encoding, errors="replace")))


def prompt_bytes(lines: list[str], encoding: str, bom: bool) -> bytes:
    body = "\n".join(lines) + "\n"
    if encoding == "utf-16-le":
        return (codecs.BOM_UTF16_LE if bom else b"") + body.encode("utf-16-le", errors="surrogatepass")
    data = body.encode(encoding, errors="replace")
    return (codecs.BOM_UTF8 if bom else b"") + data


@FUZZ
@given(
    index=st.integers(min_value=0, max_value=len(PROMPT_LINES) - 1),
    line=st.one_of(
        values.map(lambda v: json.dumps(v, default=str)),
        st.dictionaries(st.sampled_from(["id", "prompt", "reference", "x"]), values, max_size=3).map(json.dumps),
        odd_text,
        st.integers(min_value=1, max_value=3000).map(lambda n: '{"prompt": ' + "[" * n + "]" * n + "}"),
    ),
    encoding=st.sampled_from(["utf-8", "utf-8", "utf-16-le", "latin-1"]),
    bom=st.booleans(),
    csv=st.booleans(),
)
def test_the_example_prompt_file_mutated(tmp_path, index, line, encoding, bom, csv):
    lines = list(PROMPT_LINES)
    if csv:
        lines = ["id,prompt,reference"] + [f"p{i},prompt {i},ref" for i in range(4)]
        index = min(index, len(lines) - 1)
    lines[index] = line
    name = "p.csv" if csv else "p.jsonl"
    (tmp_path / name).write_bytes(prompt_bytes(lines, encoding, bom))
    spec = dict(BASE, prompts={"path": name, "shard_size": 2})
    check(run_validate(tmp_path, yaml.safe_dump(spec).encode()))
