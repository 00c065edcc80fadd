"""Local mode end to end: `decodebench run` in-process and as a subprocess, resume after a kill."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from worker.store import FileStore

SPEC = """
name: local-e2e
models:
  - path: {model}
    name: tiny
prompts:
  path: {prompts}
  limit: {limit}
  shard_size: {shard}
strategies:
  - name: greedy
  - name: top_p
    params: {{p: 0.9}}
generation:
  max_new_tokens: 12
  batch_size: 4
  seeds: [0, 1]
"""


def write_spec(tmp_path, tiny_model, prompts_file, limit=8, shard=4) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(SPEC.format(model=tiny_model, prompts=prompts_file, limit=limit, shard=shard))
    return p


def sweep_dir(out: Path) -> Path:
    (sweep,) = (out / "default" / "sweeps").iterdir()
    return sweep


def test_run_end_to_end_layout_table_and_logs(tmp_path, tiny_model, prompts_file):
    spec = write_spec(tmp_path, tiny_model, prompts_file)
    out = tmp_path / "runs"
    result = CliRunner().invoke(
        main, ["--log-format", "json", "--log-level", "warning", "run", str(spec), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert '"event": "job.start"' not in result.output  # the console level hides info lines ...
    assert "6 jobs run, 0 already complete, 0 failed" in result.output
    # no TTY (make demo's case): a progress line per tenth of the jobs (here each of the 6) on stderr only
    progress = [line for line in result.stderr.splitlines() if line.startswith("jobs ")]
    assert [p.split(" done")[0] for p in progress] == [f"jobs {i}/6" for i in range(1, 7)]
    assert "done (" not in result.stdout
    assert "tiny" in result.output and "greedy" in result.output and "top_p" in result.output
    sweep = sweep_dir(out)
    assert json.loads((sweep / "spec.json").read_text())["spec"]["name"] == "local-e2e"
    jobs = list((sweep / "jobs").iterdir())
    assert len(jobs) == 6
    for job in jobs:
        assert {p.name for p in job.iterdir()} == {"result.json", "generations.jsonl", "log.jsonl"}
        lines = [json.loads(x) for x in (job / "log.jsonl").read_text().splitlines()]
        assert {"job.start", "job.done"} <= {x["event"] for x in lines}  # ... but each job's log keeps them
        for line in lines:
            assert line["job_id"] == job.name and line["sweep_id"] == sweep.name
            assert line["model"] == "tiny" and line["strategy"]
    gens = [json.loads(x) for job in jobs for x in (job / "generations.jsonl").read_text().splitlines()]
    assert len(gens) == 8 + 8 * 2  # greedy once, top_p per seed
    report = sweep / "report"
    assert (report / "summary.csv").exists() and (report / "summary.md").exists()


def test_one_of_each_reads_in_the_singular(tmp_path, tiny_model, prompts_file):
    spec = write_spec(tmp_path, tiny_model, prompts_file, limit=1, shard=1)
    spec.write_text(spec.read_text().replace("  - name: top_p\n    params: {p: 0.9}\n", ""))
    res = CliRunner().invoke(main, ["validate", str(spec)])
    assert res.exit_code == 0, res.output
    assert ": 1 cell, 1 job, 1 prompt, 1 generation, up to 12 tokens to generate" in res.output
    res = CliRunner().invoke(main, ["--log-level", "warning", "run", str(spec), "--out", str(tmp_path / "runs")])
    assert res.exit_code == 0, res.output
    assert ": 1 job run, 0 already complete, 0 failed" in res.stdout and "jobs 1/1 done" in res.stderr


def test_second_run_skips_complete_jobs(tmp_path, tiny_model, prompts_file):
    spec = write_spec(tmp_path, tiny_model, prompts_file, limit=4, shard=4)
    out = tmp_path / "runs"
    first = CliRunner().invoke(main, ["--log-format", "json", "run", str(spec), "--store", str(out), "-v"])
    assert first.exit_code == 0 and '"event": "job.start"' in first.output  # info lines with -v
    again = CliRunner().invoke(main, ["run", str(spec), "--out", str(out)])
    assert again.exit_code == 0
    assert "0 jobs run, 3 already complete" in again.output


def test_a_sweep_resumed_after_its_model_changed_is_refused(tmp_path, tiny_model, small_model, prompts_file):
    """Another model's files at the same path, resumed, would mix two models in one cell: refused in one line before
    any job runs (exit 2, nothing written or lost); with the files restored the sweep resumes. A sweep whose jobs did
    mix (the old resume, or workers holding other files) is refused by the report."""
    model = tmp_path / "mdl"
    shutil.copytree(tiny_model, model)
    spec = write_spec(tmp_path, model, prompts_file, limit=8, shard=4)
    spec.write_text(spec.read_text().replace("  - name: top_p\n    params: {p: 0.9}\n", ""))  # greedy: 2 jobs
    out = tmp_path / "runs"
    run = ["--log-level", "warning", "run", str(spec), "--store", str(out), "--no-progress"]
    assert CliRunner().invoke(main, run).exit_code == 0
    kept, lost = sorted((sweep_dir(out) / "jobs").iterdir())
    shutil.rmtree(lost)  # as if the run had been stopped before this job
    shutil.rmtree(model)
    shutil.copytree(small_model, model)
    before = (kept / "result.json").read_bytes()
    refused = CliRunner().invoke(main, run)
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert f"error: model 'tiny' ({model}): its files changed since this sweep's complete jobs" in refused.stderr
    assert "restore them, or run it as a new sweep" in refused.stderr
    assert not lost.exists() and (kept / "result.json").read_bytes() == before  # nothing run, nothing lost
    shutil.rmtree(model)
    shutil.copytree(tiny_model, model)
    resumed = CliRunner().invoke(main, run)
    assert resumed.exit_code == 0 and "1 job run, 1 already complete, 0 failed" in resumed.stdout, resumed.output
    result = json.loads((kept / "result.json").read_text())  # a mixed sweep, as the old resume left it
    result["provenance"]["model"]["content_hash"] = "0" * 64
    (kept / "result.json").write_text(json.dumps(result))
    report = CliRunner().invoke(main, ["report", sweep_dir(out).name, "--store", str(out), "--n-boot", "0"])
    assert report.exit_code == 2, report.output
    assert f"error: model 'tiny' ({model}): the sweep's complete jobs of it ran on different files" in report.stderr
    assert f"000000000000: 1 job, e.g. {kept.name}" in report.stderr


def test_a_sweep_resumed_after_its_scorer_or_draft_changed_is_refused(tmp_path, tiny_model, small_model, prompts_file):
    """Only the generating model's files were compared: a scorer replaced between runs mixed two scorers' perplexities
    in one column, and an assisted strategy's draft was not even recorded in the provenance. Now every model a job
    loads is recorded and compared, on resume and in the report."""
    scorer, draft = tmp_path / "scorer", tmp_path / "draft"
    shutil.copytree(tiny_model, scorer)
    shutil.copytree(tiny_model, draft)
    spec = write_spec(tmp_path, tiny_model, prompts_file, limit=8, shard=4)
    spec.write_text(
        spec.read_text().replace(
            "  - name: top_p\n    params: {p: 0.9}\n", f"  - name: assisted\n    params: {{assistant: {draft}}}\n"
        )
        + f"scorer:\n  path: {scorer}\n  name: judge-lm\nmetrics: [perplexity, mean_length]\n"
    )
    out = tmp_path / "runs"
    run = ["--log-level", "warning", "run", str(spec), "--store", str(out), "--no-progress"]
    assert CliRunner().invoke(main, run).exit_code == 0
    jobs = sorted((sweep_dir(out) / "jobs").iterdir())
    records = [json.loads((j / "result.json").read_text()) for j in jobs]
    assisted = [r for r in records if r["job"]["strategy"]["name"] == "assisted"]
    assert assisted and all(r["provenance"]["assistant"]["path"] == str(draft) for r in assisted)
    assert all(len(r["provenance"]["assistant"]["content_hash"]) == 64 for r in assisted)
    # as if the run had been stopped before an assisted job, which loads both (a greedy job's order among the job ids,
    # which the test's temporary paths decide, would leave the draft out of the resume)
    lost = next(j for j, r in zip(jobs, records) if r["job"]["strategy"]["name"] == "assisted")
    shutil.rmtree(lost)
    for changed in (scorer, draft):
        shutil.rmtree(changed)
        shutil.copytree(small_model, changed)
        refused = CliRunner().invoke(main, run)
        assert refused.exit_code == 2, refused.output
        assert f"({changed}): its files changed since this sweep's complete jobs" in refused.stderr
        shutil.rmtree(changed)
        shutil.copytree(tiny_model, changed)
    assert CliRunner().invoke(main, run).exit_code == 0
    kept = next(j for j in jobs if j != lost and "scorer" in json.loads((j / "result.json").read_text())["provenance"])
    result = json.loads((kept / "result.json").read_text())  # a sweep mixing two scorers, as the old resume left it
    result["provenance"]["scorer"]["content_hash"] = "0" * 64
    (kept / "result.json").write_text(json.dumps(result))
    report = CliRunner().invoke(main, ["report", sweep_dir(out).name, "--store", str(out), "--n-boot", "0"])
    assert report.exit_code == 2, report.output
    assert (
        f"error: model 'judge-lm' ({scorer}): the sweep's complete jobs of it ran on different files" in report.stderr
    )


@pytest.mark.slow
def test_interrupted_run_resumes_without_redoing_finished_jobs(tmp_path, tiny_model, prompts_file):
    spec = write_spec(tmp_path, tiny_model, prompts_file, limit=16, shard=2)
    out = tmp_path / "runs"
    cmd = [str(Path(sys.executable).with_name("decodebench")), "run", str(spec), "--out", str(out), "--no-progress"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    done: list[Path] = []
    while time.monotonic() < deadline and len(done) < 3:
        time.sleep(0.2)
        done = list(out.glob("default/sweeps/*/jobs/*/result.json"))
    proc.send_signal(signal.SIGKILL)  # killed half way, as by the OOM killer
    proc.wait()
    store = FileStore(out)
    sweep = sweep_dir(out).name
    finished = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("default/sweeps/*/jobs/*/result.json")}
    assert 3 <= len(finished) < 24  # 8 shards x (greedy + 2 seeds of top_p)
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{24 - len(finished)} jobs run, {len(finished)} already complete, 0 failed" in resumed.stdout
    for job_id, mtime in finished.items():  # finished jobs were not redone
        assert (out / "default/sweeps" / sweep / "jobs" / job_id / "result.json").stat().st_mtime_ns == mtime
    assert len(store.complete_job_ids("default", sweep)) == 24
    prompt_ids = [
        (g.cell, g.job_seed, g.prompt_id)
        for j in store.complete_job_ids("default", sweep)
        for g in store.load_generations("default", sweep, j)
    ]
    assert len(prompt_ids) == len(set(prompt_ids)) == 16 + 16 * 2


@pytest.mark.slow
def test_ctrl_c_says_how_to_resume(tmp_path, tiny_model, prompts_file):
    spec = write_spec(tmp_path, tiny_model, prompts_file, limit=16, shard=1)
    # enough work that the sweep is still running when the first result appears, on an idle machine too
    spec.write_text(spec.read_text().replace("seeds: [0, 1]", f"seeds: {list(range(12))}"))
    out = tmp_path / "runs"
    cmd = [str(Path(sys.executable).with_name("decodebench")), "run", str(spec), "--out", str(out)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell's background job starts with SIGINT ignored, and Python keeps it so: Ctrl-C's default here
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(out.glob("default/sweeps/*/jobs/*/result.json")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted (Ctrl-C); complete jobs are kept, run the same command again to resume: ")
    assert f"decodebench run {spec}" in last  # (with --store where the default store is another)


def test_result_pins_its_generations(tmp_path, tiny_model, prompts_file):
    """A generations file that does not match its result.json is reported, not silently aggregated."""
    spec = write_spec(tmp_path, tiny_model, prompts_file, limit=4, shard=4)
    out = tmp_path / "runs"
    assert CliRunner().invoke(main, ["run", str(spec), "--out", str(out)]).exit_code == 0
    gens = next(sweep_dir(out).glob("jobs/*/generations.jsonl"))
    gens.write_text(gens.read_text().replace('"text": "', '"text": "tampered ', 1))
    result = CliRunner().invoke(main, ["report", sweep_dir(out).name, "--store", str(out)])
    assert result.exit_code == 1
    assert f"job {gens.parent.name}: generations.jsonl does not match its result.json" in result.output


def test_missing_device_fails_before_anything_is_written(tmp_path, tiny_model, prompts_file, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = write_spec(tmp_path, tiny_model, prompts_file, limit=4, shard=4)
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(spec), "--out", str(out), "--device", "cuda:0"])
    assert result.exit_code == 2
    assert (
        result.output.strip()
        == "error: --device cuda:0: CUDA is not available on this machine; use --device cpu explicitly"
    )
    assert not out.exists()


GREEDY_AND_BEAM = """
name: one-seed
models:
  - path: {model}
prompts:
  path: {prompts}
  limit: 8
strategies:
  - name: greedy
  - name: beam
    params: {{num_beams: 2}}
generation:
  max_new_tokens: 8
  batch_size: 8
"""


def test_a_one_seed_greedy_and_beam_sweep_gets_intervals_and_comparisons_in_every_format(
    tmp_path, tiny_model, prompts_file
):
    """Issue 46: the prompt is the resampling unit, so a sweep with one seed (the common greedy-against-beam
    case) reports intervals and Holm-corrected comparisons like a sweep with many (it had none before)."""
    import pandas as pd

    spec = tmp_path / "sweep.yaml"
    spec.write_text(GREEDY_AND_BEAM.format(model=tiny_model, prompts=prompts_file))
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["--log-level", "warning", "run", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = sweep_dir(out) / "report"
    summary = pd.read_csv(report / "summary.csv")
    beam = summary[summary["strategy"] == "beam"].iloc[0]
    assert beam["n_seeds"] == 1 and beam["distinct_2_ci_low"] <= beam["distinct_2"] <= beam["distinct_2_ci_high"]
    assert beam["baseline"].endswith("::greedy") and 0 <= beam["mean_length_diff_p_holm"] <= 1
    assert "## Paired comparisons" in (report / "summary.md").read_text()
    doc = json.loads((report / "summary.json").read_text())
    assert doc["ci"]["unit"] == "prompt"
    html = (report / "report.html").read_text()
    assert "Paired comparisons" in html and "No intervals" not in html
