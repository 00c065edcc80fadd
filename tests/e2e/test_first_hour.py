"""The first hour of a new user (issue 42, items 1, 2 and 5): `decodebench run` as the README writes it
prints the bar, warnings and the result (each job's info lines stay in its log.jsonl, and show with -v);
the next commands it prints, and the README's, work as written in the default store; "no sweep" names the
store that has it; the store and the report's file have flags of their own; skipped jobs are not counted
as done; `status` says "failed" and exits non-zero when jobs failed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.cli.distributed import render_status
from tests.support.repo import REPO

SPEC = """
name: first-hour
models:
  - path: {model}
    name: tiny
prompts:
  path: {prompts}
  limit: 4
  shard_size: 2
strategies:
  - name: greedy
  - name: top_p
    params: {{p: 0.9}}
generation:
  max_new_tokens: 6
  batch_size: 2
  seeds: [0]
  warmup: false
"""


def cli(*args: str, **kw):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, **kw)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_model, prompts_file, signing_key_file):
    """`decodebench run sweep.yaml` in a fresh directory, with no store named: the default ./runs. Once for
    the module: the tests that read it each get a copy (`ran`)."""
    here = tmp_path_factory.mktemp("first-hour")
    with pytest.MonkeyPatch.context() as mp:  # as tests/conftest.py's _no_user_env, with no store named
        for key in [k for k in os.environ if k.startswith("DECODEBENCH_")]:
            mp.delenv(key)
        mp.setenv("DECODEBENCH_SIGNING_KEY_FILE", signing_key_file)
        mp.chdir(here)
        (here / "sweep.yaml").write_text(SPEC.format(model=tiny_model, prompts=prompts_file))
        res = cli("run", "sweep.yaml")
    assert res.exit_code == 0, res.output
    return here, res


@pytest.fixture()
def ran(first_run, tmp_path, monkeypatch):
    """That run's directory, copied for this test (the tests write and rename in it), as the current one."""
    here, res = first_run
    shutil.copytree(here, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DECODEBENCH_STORE", raising=False)
    monkeypatch.delenv("DECODEBENCH_LOG_LEVEL", raising=False)
    return tmp_path, res


def test_run_shows_the_result_not_each_jobs_info_lines(ran):
    tmp_path, res = ran
    assert "job.start" not in res.output and "job.done" not in res.output  # the README's run: no flood
    (sweep,) = (tmp_path / "runs" / "default" / "sweeps").iterdir()
    logs = [json.loads(line) for log in sweep.glob("jobs/*/log.jsonl") for line in log.read_text().splitlines()]
    assert len(list(sweep.glob("jobs/*/log.jsonl"))) == 4 and any(e["event"] == "job.start" for e in logs)
    assert "jobs 4/4 done" in res.stderr
    verbose = cli("run", "sweep.yaml", "-v")  # resumes (nothing to do) and says it at info level
    assert verbose.exit_code == 0 and "sweep.start" in verbose.output


def test_the_printed_next_commands_and_the_readmes_work_as_written(ran):
    tmp_path, res = ran
    sweep_id = re.search(r"sweep (\w+): 4 jobs run", res.stdout).group(1)
    nexts = [line.split("next:")[-1].split("  (")[0].strip() for line in res.stdout.splitlines()[-2:]]
    assert nexts[0].startswith("decodebench report ") and nexts[1].startswith("decodebench rate export ")
    readme = (REPO / "README.md").read_text()
    local = readme[readme.index("decodebench validate examples/quickstart.yaml") :].split("```")[0]  # the local block
    lines = [
        line.split("  #")[0].strip()
        for line in local.splitlines()
        if "<sweep-id>" in line and " rate " not in line  # the rating ones are sized for the quickstart
    ]
    assert len(lines) >= 3
    (tmp_path / "other.yaml").write_text((tmp_path / "sweep.yaml").read_text().replace("first-hour", "other-hour"))
    other = cli("run", "other.yaml")  # --compare's other sweep (a sweep compared with itself is refused)
    other_id = re.search(r"sweep (\w+): 4 jobs run", other.stdout).group(1)
    here = [line.replace("<sweep-id>", sweep_id).replace("<other-id>", other_id) for line in lines]
    for command in nexts + here:
        argv = shlex.split(command)
        assert argv[0] == "decodebench" and "--store" not in argv, command  # the default store finds it
        out = cli(*argv[1:])
        assert out.exit_code == 0, (command, out.output)
    assert (tmp_path / "summary.csv").read_text().startswith("model,strategy,params")
    assert (tmp_path / f"ratings-{sweep_id}-round-1" / "sheet-r1.csv").is_file()  # the first rating round


def test_no_sweep_names_the_store_that_has_it(ran):
    tmp_path, res = ran
    sweep_id = re.search(r"sweep (\w+): 4 jobs run", res.stdout).group(1)
    (tmp_path / "runs" / "demo").mkdir()
    (tmp_path / "runs" / "default").rename(tmp_path / "runs" / "demo" / "default")  # as `--store runs/demo` wrote
    out = CliRunner().invoke(main, ["report", sweep_id[:8]])
    assert out.exit_code == 2
    assert f"no sweep '{sweep_id[:8]}'" in out.output and "it is in runs/demo: add --store runs/demo" in out.output
    again = cli("report", sweep_id[:8], "--store", "runs/demo", "--n-boot", "0")
    assert again.exit_code == 0, again.output


def test_the_store_and_the_reports_file_have_flags_of_their_own(ran):
    tmp_path, res = ran
    sweep_id = re.search(r"sweep (\w+): 4 jobs run", res.stdout).group(1)
    out = cli("report", sweep_id, "--n-boot", "0", "--format", "json", "--output", "s.json")
    assert out.exit_code == 0 and isinstance(json.loads((tmp_path / "s.json").read_text()), (list, dict))
    old = cli("report", sweep_id, "--n-boot", "0", "--out", "old.md")  # the former name still works, and says so
    assert old.exit_code == 0 and (tmp_path / "old.md").is_file() and "--output" in old.stderr
    csv = cli("report", sweep_id, "--n-boot", "0", "--format", "csv")  # --format alone: that format on stdout
    assert csv.exit_code == 0 and csv.stdout.startswith("model,strategy,params"), csv.stdout[:200]
    assert "--output FILE" in cli("report", "--help").output and "--store" in cli("run", "--help").output
    assert "--out " not in cli("run", "--help").output  # one name for the store
    moved = cli("run", "sweep.yaml", "--out", str(tmp_path / "elsewhere"))  # a store by its former name
    assert moved.exit_code == 0 and (tmp_path / "elsewhere" / "default").is_dir()


def test_skipped_jobs_are_not_counted_as_done(tmp_path, monkeypatch, tiny_model, prompts_file):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "no-weights"
    bad.mkdir()
    (bad / "config.json").write_text((Path(tiny_model) / "config.json").read_text())  # a model that cannot load
    (tmp_path / "sweep.yaml").write_text(SPEC.format(model=bad, prompts=prompts_file))
    res = CliRunner().invoke(main, ["run", "sweep.yaml", "--no-check-models"])
    assert res.exit_code == 1, res.output
    last = [line for line in res.stderr.splitlines() if line.startswith("jobs ")][-1]
    # docs/sweeps.md: a model that fails to load fails its first job, and its other jobs are skipped; the progress
    # line, the run's line and the reason's line count them alike
    assert "jobs 4/4 finished: 0 done, 3 skipped, 1 failed" in last, res.stderr
    assert "0 jobs run, 0 already complete, 1 failed, 3 skipped (model unavailable)" in res.stdout
    assert res.stderr.rstrip().endswith("; 1 job failed, 3 jobs skipped"), res.stderr


def test_a_local_run_s_logs_and_report_need_no_redis(tmp_path, monkeypatch, tiny_model, prompts_file):
    """docs/sweeps.md, "Local mode": `decodebench logs JOB` reads a local run's log from the store (its sweep found
    there, or given by a prefix), with no Redis to ask; `report` on a local sweep with no complete job points at
    what works locally, not at `status` (which reads Redis)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DECODEBENCH_REDIS_URL", "redis://127.0.0.1:9/0")  # nothing listens there
    bad = tmp_path / "no-weights"
    bad.mkdir()
    (bad / "config.json").write_text((Path(tiny_model) / "config.json").read_text())  # its jobs fail at once
    (tmp_path / "sweep.yaml").write_text(SPEC.format(model=bad, prompts=prompts_file))
    assert CliRunner().invoke(main, ["run", "sweep.yaml", "--store", "local", "--no-check-models"]).exit_code == 1
    (sweep,) = (tmp_path / "local" / "default" / "sweeps").iterdir()
    (job,) = [j.name for j in (sweep / "jobs").iterdir() if (j / "log.jsonl").is_file()]  # the one that failed
    for extra in ([], ["--sweep", sweep.name[:6]]):
        res = CliRunner().invoke(main, ["logs", job, "--store", "local", *extra])
        assert res.exit_code == 0, res.output
        assert "job.failed" in res.stdout and "Redis" not in res.output
    res = CliRunner().invoke(main, ["logs", "f" * 16, "--store", "local"])
    assert res.exit_code == 2 and res.stderr.startswith(f"error: no sweep of tenant 'default' in file://{tmp_path}")
    res = CliRunner().invoke(main, ["report", sweep.name, "--store", "local"])
    assert res.exit_code == 2 and "no complete jobs yet" in res.stderr, res.output
    assert "decodebench status" not in res.stderr and f"decodebench logs JOB --sweep {sweep.name}" in res.stderr


STATUS = {
    "sweep_id": "sweep0000000000a", "name": "demo", "tenant": "default", "queue": "decodebench.default.normal",
    "cancelled": False, "jobs": 12, "complete": True, "cells": {"m::greedy": {"failed": 12}},
    "totals": {"queued": 0, "running": 0, "done": 0, "failed": 12, "cancelled": 0},
    "jobs_per_s": None, "tokens_per_s": None, "eta_s": None, "lost": 0, "stale": 0, "n_failures": 0,
    "failures": [], "problems": [],
}  # fmt: skip


def test_status_says_failed_when_every_job_failed():
    text = render_status(STATUS)
    assert "complete" not in text and "failed: 12 jobs failed" in text
    assert "complete" in render_status({**STATUS, "totals": {**STATUS["totals"], "failed": 0, "done": 12}})


def test_status_exits_non_zero_when_the_sweep_ended_with_failures(monkeypatch):
    import controller.cli.distributed as distributed

    class Fake:
        def status(self, sweep):
            return STATUS

    monkeypatch.setattr(distributed, "backend", lambda *a: Fake())
    res = CliRunner().invoke(main, ["status", "sweep0000000000a"])
    assert res.exit_code == 1 and "failed: 12 jobs failed" in res.output


def test_make_demo_writes_where_the_readmes_commands_look():
    """The default store, no --store: `decodebench report SWEEP` and the rest find the demo's sweep."""
    makefile = (REPO / "Makefile").read_text()
    demo = makefile[makefile.index("\ndemo:") :].split("\n\n")[0]
    assert "decodebench run examples/quickstart.yaml" in demo and "--out" not in demo and "--store" not in demo
