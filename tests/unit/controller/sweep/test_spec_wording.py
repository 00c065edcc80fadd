"""Every spec error names the fix in the user's words (issue 42, item 5): did-you-mean for a misspelt key,
a key of another tool and a strategy's other name, a tab named as a tab, and no pydantic wording.
Also the smaller wording of the first hour: a difference of counts without decimals, README's sweep the
real file."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from controller.report.render.format import compare_table
from controller.sweep.load import load_spec, parse_spec
from tests.support.repo import REPO
from worker.core.errors import UsageError

pytestmark = pytest.mark.pure
BASE = {"name": "x", "models": [{"path": "gpt2"}], "prompts": {"inline": ["a"]}, "strategies": [{"name": "greedy"}]}


def refusal(**change) -> str:
    with pytest.raises(UsageError) as err:
        parse_spec({**BASE, **change}, "sweep.yaml")
    return str(err.value)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"generaton": {}}, "sweep.yaml: generaton: unknown key; did you mean 'generation'?"),
        ({"generation": {"max_tokens": 3}}, "generation.max_tokens: unknown key; did you mean 'max_new_tokens'?"),
        ({"max_tokens": 3}, "sweep.yaml: max_tokens: unknown key here; did you mean generation.max_new_tokens?"),
        ({"prompts": {"inline": ["a"], "limt": 3}}, "sweep.yaml: prompts.limt: unknown key; did you mean 'limit'?"),
        ({"strategies": [{"name": "nucleus"}]}, "did you mean 'top_p'?"),
        ({"strategies": [{"name": "beam_search"}]}, "did you mean 'beam'?"),
        ({"models": ["gpt2"]}, "sweep.yaml: models[0]: a model is a mapping: write `- path: gpt2`"),
        ({"strategies": ["greedy"]}, "sweep.yaml: strategies[0]: a strategy is a mapping: write `- name: greedy`"),
        ({"generation": {"batch_size": "fast"}}, "generation.batch_size: must be an integer or 'auto', got 'fast'"),
    ],
)  # fmt: skip
def test_spec_errors_say_what_to_write(change, expected):
    message = refusal(**change)
    assert expected in message, message
    assert "Input should be" not in message and "Extra inputs" not in message and ".int" not in message


def test_a_misspelt_key_is_named_before_the_required_one_it_hides():
    with pytest.raises(UsageError) as err:
        parse_spec({k: v for k, v in {**BASE, "generaton": {}}.items() if k != "name"}, "sweep.yaml")
    message = str(err.value)
    assert message.startswith("sweep.yaml: generaton: unknown key; did you mean 'generation'?"), message
    assert message.endswith("(and 1 more)") and "\n" not in message


def test_an_unknown_key_far_from_any_lists_the_valid_ones():
    message = refusal(zzzz=1)
    assert "zzzz: unknown key; valid here: " in message and "generation" in message and "strategies" in message


@pytest.mark.parametrize(
    "text, line",
    [("name: x\nmodels:\n\t- path: gpt2\n", 3), ("name: x\ngeneration:\n  max_new_tokens: 3\n\tbatch_size: 2\n", 4)],
)
def test_a_tab_in_yaml_is_named_as_a_tab(tmp_path, text, line):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        load_spec(path)
    assert f"sweep.yaml:{line}: a tab character" in str(err.value) and "spaces" in str(err.value)


def test_a_difference_of_counts_has_no_decimals():
    comparison = pd.DataFrame(
        {"model": ["m"], "strategy": ["greedy"], "params": ["{}"], "present": ["both"],
         "n_generations_delta": [-8.0], "tokens_per_s_delta": [12.345]}
    )  # fmt: skip
    table = compare_table(comparison)
    assert "Δ n" in table and re.search(r"\| -8 \|", table), table
    note = table.splitlines()[-1]  # what a delta is not, under the table
    assert note.startswith("Δ: B − A") and "no interval or test" in note and "#comparing-sweeps" in note, table


def test_the_readme_sweep_is_the_real_quickstart_file():
    """Every ```yaml block of README.md and docs/ that names an examples/ file as its first line is that file."""
    checked = 0
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S):
            first, _, body = block.partition("\n")
            if re.fullmatch(r"# examples/[\w./-]+\.ya?ml", first.strip()):
                assert body == (REPO / first.strip()[2:]).read_text(), f"{doc.name}: {first} differs from the file"
                checked += 1
    readme_first = re.search(r"```yaml\n(.*?)\n", (REPO / "README.md").read_text()).group(1)
    assert readme_first == "# examples/quickstart.yaml" and checked >= 1
