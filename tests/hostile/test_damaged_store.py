"""A damaged store: a truncated or corrupt result.json or generations.jsonl of a finished
local sweep is named in one warning line, its job is left out as missing, and `report`
still writes the report of the rest (exit 1: the report is incomplete)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.report.load.sweep import load_sweep
from worker.store import FileStore

SPEC = """
name: damaged
models:
  - path: {model}
    name: tiny
prompts:
  inline: ["It was a truth universally acknowledged", "Mr. Darcy said"]
  shard_size: 1
strategies:
  - name: greedy
generation:
  max_new_tokens: 4
  batch_size: 2
  warmup: false
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model) -> tuple[Path, str]:
    """A finished local sweep of two jobs (one prompt each): (store directory, sweep id)."""
    root = tmp_path_factory.mktemp("damaged")
    (root / "sweep.yaml").write_text(SPEC.format(model=tiny_model))
    out = root / "runs"
    result = CliRunner().invoke(main, ["--log-level", "warning", "run", str(root / "sweep.yaml"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (sweep,) = (out / "default" / "sweeps").iterdir()
    return out, sweep.name


@pytest.fixture()
def store_copy(finished, tmp_path) -> tuple[Path, str, Path]:
    """A copy of the finished store and the directory of its last job."""
    out, sweep = finished
    copy = tmp_path / "runs"
    shutil.copytree(out, copy)
    last = sorted((copy / "default" / "sweeps" / sweep / "jobs").iterdir())[-1]
    return copy, sweep, last


def report(store: Path, sweep: str):
    return CliRunner().invoke(main, ["report", sweep, "--store", str(store), "--n-boot", "0"])


def warnings_naming(output: str, path: Path) -> list[str]:
    return [line for line in output.splitlines() if str(path) in line]


def last_record_start(data: bytes) -> int:
    """Offset of the last record: the start of the last line of a JSONL file."""
    return data.rstrip(b"\n").rfind(b"\n") + 1


def check_cuts(store: Path, sweep: str, damaged: Path, cuts: range, reason: str) -> None:
    """At every cut, reading the sweep names the file once and leaves its job out; at 12 of them, spread
    over the cuts (`report` takes a tenth of a second), `report` still writes the report of the rest."""
    data = damaged.read_bytes()
    opened = FileStore(store)
    for cut in cuts:
        damaged.write_bytes(data[:cut])
        swept = load_sweep(opened, "default", sweep)
        assert len(swept.results) == 1 and len(swept.damaged) == 1, cut
        assert str(damaged) in swept.damaged[0] and reason in swept.damaged[0] and "\n" not in swept.damaged[0]
    report_md = store / "default" / "sweeps" / sweep / "report" / "summary.md"
    for cut in cuts[:: max(1, len(cuts) // 12)]:
        damaged.write_bytes(data[:cut])
        report_md.unlink(missing_ok=True)
        result = report(store, sweep)
        assert result.exit_code == 1 and "Traceback" not in result.output, (cut, result.output)
        named = warnings_naming(result.output, damaged)
        assert len(named) == 1 and reason in named[0], (cut, result.output)
        assert report_md.is_file() and "greedy" in report_md.read_text()
    damaged.write_bytes(data)
    assert report(store, sweep).exit_code == 0


def test_every_truncation_of_the_last_generation_record_is_named_and_12_of_them_still_write_the_report(store_copy):
    store, sweep, last = store_copy
    gens = last / "generations.jsonl"
    data = gens.read_bytes()
    cuts = range(last_record_start(data), len(data))  # every byte boundary of the last record
    check_cuts(store, sweep, gens, cuts, "does not match its result.json")


def test_every_truncation_of_the_last_result_file_is_named_and_the_job_left_out_and_12_write_the_report(store_copy):
    store, sweep, last = store_copy
    result_file = last / "result.json"
    # result.json holds one record: every byte boundary of the file
    check_cuts(store, sweep, result_file, range(len(result_file.read_bytes())), "truncated or not JSON")


@pytest.mark.parametrize(
    "damage",
    [
        b"\xff\xfe not utf-8",
        b'{"job": "not a job spec"}',
        b"[" * 100_000,
        b"null",
    ],
    ids=["not-utf8", "wrong-shape", "deep-nesting", "null"],
)
def test_a_corrupt_result_file_is_one_warning_line(store_copy, damage):
    store, sweep, last = store_copy
    (last / "result.json").write_bytes(damage)
    result = report(store, sweep)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(warnings_naming(result.output, last / "result.json")) == 1, result.output


SWEEP_RECORDS = {
    "spec-truncated": ("spec.json", lambda data: data[: len(data) // 2], "truncated or not JSON"),
    "spec-a-list": ("spec.json", lambda data: b"[1, 2]", "not a stored sweep spec (a JSON object)"),
    "spec-null": ("spec.json", lambda data: b"null", "not a stored sweep spec"),
    "spec-inner-a-string": ("spec.json", lambda data: b'{"spec": "x"}', "not a stored sweep spec"),
    "spec-generation-a-number": (
        "spec.json",
        lambda data: json.dumps({**json.loads(data), "spec": {**json.loads(data)["spec"], "generation": 5}}).encode(),
        "spec.generation is not a JSON object",
    ),
    "spec-seeds-a-number": (
        "spec.json",
        lambda data: json.dumps(
            {**json.loads(data), "spec": {**json.loads(data)["spec"], "generation": {"seeds": 7}}}
        ).encode(),
        "spec.generation.seeds is not a JSON array",
    ),
    "plan-truncated": ("plan.json", lambda data: data[: len(data) // 2], "truncated or not JSON"),
    "plan-null": ("plan.json", lambda data: b"null", 'not a plan (an object with a "jobs" array)'),
    "plan-cells-unhashable": (
        "plan.json",
        lambda data: json.dumps({"jobs": [{"cell": []}]}).encode(),
        'jobs[0] is not an object with a string "cell"',
    ),
    "plan-deep-nesting": ("plan.json", lambda data: b"[" * 100_000, "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(SWEEP_RECORDS))
def test_a_damaged_spec_or_plan_is_one_warning_and_the_report_is_still_written(store_copy, case):
    store, sweep, _ = store_copy
    name, damage, reason = SWEEP_RECORDS[case]
    record = store / "default" / "sweeps" / sweep / name
    record.write_bytes(damage(record.read_bytes()))
    result = report(store, sweep)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    named = warnings_naming(result.output, record)
    assert len(named) == 1 and reason in named[0], result.output
    summary = (store / "default" / "sweeps" / sweep / "report" / "summary.md").read_text()
    assert "greedy" in summary and "tiny" in summary  # both jobs, from their own specs
