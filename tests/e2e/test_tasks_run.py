"""A task sweep end to end (issue 38, part 2 and 4): the bundled adder-tiny model over a temperature grid,
`decodebench run` then `report`: accuracy with intervals, pass@k and maj@k, the paired comparisons and
the accuracy-against-temperature figure."""

from __future__ import annotations

import json

import pandas as pd
from click.testing import CliRunner

from controller.cli import main
from tests.support.repo import REPO

SPEC = """
name: task-e2e
models:
  - path: {model}
prompts:
  path: {prompts}
  limit: 8
  shard_size: 8
strategies:
  - name: greedy
  - name: sample
    params: {{temperature: [1.0, 4.0]}}
generation:
  max_new_tokens: 40
  batch_size: 8
  warmup: false
  seeds: [0, 1, 2]
task:
  extract: [{{regex: "#([0-9]+)"}}]
metrics: [exact_match, answered, pass@1, pass@3, maj@3, distinct_answers]
"""


def test_a_task_sweep_reports_accuracy_by_temperature(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        SPEC.format(model=REPO / "examples/models/adder-tiny", prompts=REPO / "examples/prompts/addition.jsonl")
    )
    out = tmp_path / "runs"
    run = CliRunner().invoke(main, ["--log-level", "warning", "run", str(spec), "--out", str(out)])
    assert run.exit_code == 0, run.output
    (sweep,) = (out / "default" / "sweeps").iterdir()
    report = CliRunner().invoke(main, ["report", sweep.name, "--store", str(out)])
    assert report.exit_code == 0, report.output
    summary = pd.read_csv(sweep / "report" / "summary.csv").set_index("params")
    greedy = summary[summary["strategy"] == "greedy"].iloc[0]
    hot, mild = summary.loc['{"temperature":4.0}'], summary.loc['{"temperature":1.0}']
    # greedy is right on these held-out problems; sampling at temperature 4 is not, and often writes no `#` answer
    assert greedy["exact_match"] == 1.0 and greedy["answered"] == 1.0
    assert hot["exact_match"] < mild["exact_match"] and hot["answered"] < mild["answered"]
    assert mild["distinct_answers"] == 1 / 3  # three seeds agree on every prompt
    for row in (hot, mild):
        assert row["exact_match"] <= row["pass@3"] and row["pass@1"] == row["exact_match"]  # 3 seeds per prompt
        assert row["exact_match_ci_low"] <= row["exact_match"] <= row["exact_match_ci_high"]
        assert 0 <= row["maj@3"] <= 1
    assert pd.isna(greedy["pass@3"]) and pd.isna(greedy["maj@3"])  # one generation per prompt
    assert pd.notna(hot["exact_match_diff_p_holm"])  # against greedy, the baseline
    html = (sweep / "report" / "report.html").read_text()
    assert "chart-accuracy-temperature" in html and "Accuracy against temperature" in html
    spec_json = json.loads((sweep / "spec.json").read_text())
    assert spec_json["spec"]["task"]["extract"][0]["regex"] == "#([0-9]+)"
