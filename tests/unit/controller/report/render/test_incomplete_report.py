"""A report of a sweep with a job that has no result says so where it is read (probe, 2026-12-08).

A real run of the bundled model beside a copy of it whose weights are damaged: its cell's only job fails.
`report` printed the table of the cells that ran and nothing else at the terminal, and summary.md and
report.html said "1 complete job(s) of 2" without naming the cell that was in no table."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from tests.support.services import PROMPTS, TINY_MODEL

pytestmark = pytest.mark.slow


def _sweep(tmp_path: Path) -> Path:
    broken = tmp_path / "models" / "broken tiny"
    shutil.copytree(TINY_MODEL, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_text("not weights")
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        f"name: incomplete\nmodels:\n  - path: {TINY_MODEL}\n  - path: '{broken}'\n"
        f"prompts:\n  path: {PROMPTS}\n  limit: 8\nstrategies:\n  - name: greedy\n"
        "generation:\n  max_new_tokens: 4\n  batch_size: 8\n"
    )
    return spec


def test_a_report_names_the_cells_it_has_no_complete_job_of(tmp_path):
    store = tmp_path / "runs"
    ran = CliRunner().invoke(main, ["run", str(_sweep(tmp_path)), "--store", str(store), "--no-check-models"])
    assert ran.exit_code == 1 and "1 job failed" in ran.stderr, ran.output
    sweep_id = next((store / "default" / "sweeps").iterdir()).name
    res = CliRunner().invoke(main, ["report", sweep_id, "--store", str(store), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "| austen-tiny | greedy |" in res.stdout and "broken" not in res.stdout
    note = res.stderr.strip().splitlines()[-1]
    assert note.startswith("note: 1 complete job(s) of 2: the others are still running, failed or were never run")
    assert note.endswith("Not in this report (no complete job yet): broken tiny · greedy.")
    report = store / "default" / "sweeps" / sweep_id / "report"
    assert "**Not in this report (no complete job yet): broken tiny · greedy.**" in (report / "summary.md").read_text()
    assert (
        "<b>Not in this report (no complete job yet): broken tiny · greedy.</b>" in (report / "report.html").read_text()
    )
