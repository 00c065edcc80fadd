"""Strategy plugins in jobs: the plugin's version recorded and never mixed in a sweep, a `to_config` read as
transformers reads it (or refused where it names no setting), and a plugin that fails in a job: one line, for good,
with its traceback in the job's log (docs/sweeps.md, "Write your own strategy")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from worker.core.contract import GenerationSettings, ModelSpec, StrategySpec
from worker.core.errors import PermanentJobError
from worker.engine.custom import TokenStep
from worker.strategies import STRATEGIES, Kind, Strategy
from worker.strategies.plugins import GROUP

DECODEBENCH = str(Path(sys.executable).with_name("decodebench"))

# --- the plugin's version: recorded, and a sweep never mixes two -----------------------------------

VERSIONED = """
name: versioned
models: [{{path: {model}, name: tiny}}]
prompts: {{path: {prompts}, limit: 2}}
strategies: [{{name: warm}}]
generation: {{max_new_tokens: 4, seeds: [0, 1]}}
"""


def versioned_plugin(root: Path, version: str) -> None:
    """A plugin of kind token (a GenerationConfig setting, no step of its own) from distribution warmplug `version`."""
    shutil.rmtree(root, ignore_errors=True)
    info = root / f"warmplug-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: warmplug\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\nwarm = warmplug:STRATEGY\n")
    (root / "warmplug.py").write_text(
        "from worker.strategies import Param, Strategy\n"
        "STRATEGY = Strategy('warm', 'sampling at a temperature', {'t': Param(float, 0.7, 't', min=0.1)}, True,\n"
        "    lambda p: {'do_sample': True, 'num_beams': 1, 'top_k': 0, 'top_p': 1.0, 'temperature': p['t']})\n"
    )


@pytest.mark.slow
def test_a_plugin_s_version_is_recorded_and_a_resume_or_report_across_versions_is_refused(
    tmp_path, tiny_model, prompts_file
):
    """Only a custom-kind plugin was named (in `notes`), and nowhere was compared: a sweep resumed after the plugin's
    distribution changed version mixed two versions of the strategy in one cell without a word (its id leaves the
    version out). Now every plugin's result records it in `provenance.strategy_plugin`, `run` refuses the resume in
    one line before any job runs, and the report refuses a sweep whose jobs mixed versions."""
    site = tmp_path / "site"
    versioned_plugin(site, "0.1")
    spec = tmp_path / "sweep.yaml"
    spec.write_text(VERSIONED.format(model=tiny_model, prompts=prompts_file))
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    cli = [DECODEBENCH, "--log-level", "warning"]
    run = lambda *a: subprocess.run([*cli, *a], capture_output=True, text=True, env=env, timeout=300)
    args = ("run", str(spec), "--store", str(out), "--no-progress")
    assert run(*args).returncode == 0
    (sweep,) = (out / "default" / "sweeps").iterdir()
    kept, lost = sorted((sweep / "jobs").iterdir())
    recorded = json.loads((kept / "result.json").read_text())
    assert recorded["provenance"]["strategy_plugin"] == "warm = warmplug:STRATEGY (warmplug 0.1)"
    assert "strategy warm: plugin warm = warmplug:STRATEGY (warmplug 0.1)" in recorded["notes"]
    shutil.rmtree(lost)  # as if the run had been stopped before this job
    versioned_plugin(site, "0.2")
    refused = run(*args)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert (
        "error: strategy 'warm': this sweep's complete jobs of it ran plugin warm = warmplug:STRATEGY (warmplug 0.1), "
        "now warm = warmplug:STRATEGY (warmplug 0.2); install that version again"
    ) in refused.stderr
    assert not lost.exists()
    versioned_plugin(site, "0.1")
    assert run(*args).returncode == 0 and lost.exists()
    recorded["provenance"]["strategy_plugin"] = "warm = warmplug:STRATEGY (warmplug 0.2)"  # as workers of two versions
    (kept / "result.json").write_text(json.dumps(recorded))
    report = run("report", sweep.name, "--store", str(out), "--n-boot", "0")
    assert report.returncode == 2, report.stderr
    assert "error: strategy 'warm': the sweep's complete jobs of it ran different plugins" in report.stderr


def test_a_to_config_setting_transformers_does_not_have_fails_the_job_in_one_line(tiny_model, runtime, monkeypatch):
    """GenerationConfig keeps an unknown key as an attribute nothing reads: a plugin whose `to_config` misspelt
    `temperature` ran at temperature 1, every metric computed, without a word. Now the job fails naming the key."""
    from worker.engine.plan import configure

    typo = Strategy("typo", "d", {}, True, lambda p: {"do_sample": True, "num_beams": 1, "temprature": 0.1})
    monkeypatch.setitem(STRATEGIES._entries, "typo", replace(typo, plugin="typo = typo:S (typo 1.0)"))
    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    with pytest.raises(PermanentJobError, match="strategy typo: its to_config gives 'temprature', which is not a"):
        configure(lm, StrategySpec(name="typo"), GenerationSettings())
    plan = configure(lm, StrategySpec(name="mirostat"), GenerationSettings())  # every key a setting: planned
    assert "strategy mirostat: plugin mirostat = decodebench_mirostat:STRATEGY" in plan.notes[-1]


class Crashes(TokenStep):
    """A plugin's step with a bug of its own."""

    def choose(self, scores, rows):
        return scores.argmax(-1)[len(scores) + 7]  # an index past the rows


def test_a_plugin_step_that_crashes_fails_its_job_with_the_traceback_in_the_job_s_log(
    tmp_path, tiny_model, runtime, monkeypatch
):
    """A plugin's step that raised failed its job with `IndexError: ...` alone: nowhere (not the job's log, not
    `decodebench logs`, not --debug) said where in the plugin. Now the job's log keeps the traceback, which `logs`
    prints under the failure's line; the console's failure stays one line."""
    from controller.cli.distributed import format_log_line
    from tests.support.engine import job
    from worker.core import paths
    from worker.core.logs import configure
    from worker.engine.job import run_job
    from worker.store import FileStore

    crashes = Strategy("crashes", "d", {}, False, lambda p: {}, kind=Kind.CUSTOM, step=f"{__name__}:Crashes")
    monkeypatch.setitem(STRATEGIES._entries, "crashes", replace(crashes, plugin="crashes = x:S (x 1.0)"))
    configure(level="warning")  # as the command lines do: a job's lines go to its log.jsonl
    store = FileStore(str(tmp_path))
    spec = job(tiny_model, "crashes", max_new=4)
    with pytest.raises(IndexError):
        run_job(spec, store=store, runtime=runtime)
    lines = list(store.read_jsonl(paths.log_key(spec.tenant, spec.sweep_id, spec.job_id)))
    (trace,) = [row for row in lines if row["event"] == "job.traceback"]
    assert 'test_plugin_jobs.py", line' in trace["exception"] and "in choose" in trace["exception"]
    shown = format_log_line(trace).splitlines()
    assert shown[0].endswith("job.traceback") and shown[-1].startswith("IndexError: index")


class CrashesLoudly(TokenStep):
    """A plugin's step whose error holds a large repr (a tensor's, a list of scores)."""

    def choose(self, scores, rows):
        raise ValueError("bad scores: " + "0.123456, " * 300_000)  # 3 MB of message


def test_a_crash_with_a_huge_message_leaves_a_job_log_the_server_reads(tmp_path, tiny_model, runtime, monkeypatch):
    """The message was in the job's log twice, whole (`job.failed`, then `job.traceback`): a 3 MB message made a
    6 MB log.jsonl, over the server's 4 MiB read limit, and `decodebench logs` answered 413 for the one job whose
    log says what went wrong. Now each value keeps its head and its tail (the traceback's last line names the error)."""
    from tests.support.engine import job
    from worker.core import paths, settings
    from worker.core.logs import configure
    from worker.engine.job import run_job
    from worker.store import FileStore

    loud = Strategy("loud", "d", {}, False, lambda p: {}, kind=Kind.CUSTOM, step=f"{__name__}:CrashesLoudly")
    monkeypatch.setitem(STRATEGIES._entries, "loud", replace(loud, plugin="loud = x:S (x 1.0)"))
    configure(level="warning")
    store = FileStore(str(tmp_path))
    spec = job(tiny_model, "loud", max_new=4)
    with pytest.raises(ValueError, match="bad scores"):
        run_job(spec, store=store, runtime=runtime)
    key = paths.log_key(spec.tenant, spec.sweep_id, spec.job_id)
    lines = list(store.read_jsonl(key, int(settings.get("api_max_log_mb") * 2**20)))  # as the server reads it
    (failed,) = [row for row in lines if row["event"] == "job.failed"]
    (trace,) = [row for row in lines if row["event"] == "job.traceback"]
    assert failed["error"].startswith("ValueError: bad scores: 0.123456") and "characters left out" in failed["error"]
    assert "in choose" in trace["exception"] and trace["exception"].rstrip().endswith("0.123456,")
    assert (tmp_path / key).stat().st_size < 2**18


def test_a_to_config_without_num_beams_or_do_sample_runs_as_generate_reads_it(tiny_model, runtime, monkeypatch):
    """transformers 5 leaves `num_beams` and `do_sample` None where neither the checkpoint nor the strategy sets them:
    a plugin whose to_config left them out (valid, by the docs) failed every job with "TypeError: '>' not supported
    between instances of 'NoneType' and 'int'". Now they read as generate() reads them: one beam, no sampling."""
    from tests.support.engine import job, texts

    bare = Strategy("bare", "d", {}, False, lambda p: {})
    monkeypatch.setitem(STRATEGIES._entries, "bare", replace(bare, plugin="bare = x:S (x 1.0)"))
    got, _, result = texts(runtime, job(tiny_model, "bare", max_new=8))
    assert got == texts(runtime, job(tiny_model, "greedy", max_new=8))[0]
    assert result.engine["plan"]["path"] == "decode"


def test_a_worker_whose_plugin_takes_other_parameters_fails_the_job_for_good_saying_so(tiny_model, runtime):
    """The submission server checks a sweep with its own plugins; a worker with another version of the plugin (a
    parameter it does not have) raised a bare ValueError, which the worker takes for a passing failure and retries.
    Now the job fails for good, at once, saying the two versions differ."""
    from tests.support.engine import job
    from worker.engine.plan import configure
    from worker.rq.task import classify

    lm = runtime.cache.get(ModelSpec(path=tiny_model), runtime.device)
    skewed = job(tiny_model, "mirostat", params={"tau": 3.0, "nu": 0.5}).strategy  # a newer plugin's parameter
    with pytest.raises(PermanentJobError) as err:
        configure(lm, skewed, GenerationSettings())
    permanent, reason = classify(err.value)
    assert permanent and reason.startswith("strategy mirostat: unknown parameter 'nu' for strategy 'mirostat'")
    assert "this worker's strategy, from plugin mirostat = decodebench_mirostat:STRATEGY" in reason
    assert "install the same version on both" in reason


def test_a_step_module_that_fails_as_it_is_imported_fails_the_job_for_good(tmp_path, monkeypatch):
    """The registry checks only that a custom step's module exists (it never runs plugin code but the declaration):
    a step module that raised as it ran (a SyntaxError, a NameError) escaped as itself, which the worker takes for a
    passing failure and retries. Now it is the permanent, one-line failure a missing module is."""
    from worker.engine.custom import step_class
    from worker.rq.task import classify

    (tmp_path / "brokenstep.py").write_text("import math\nVALUE = math.tau(\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    strategy = Strategy("broken", "d", {}, False, lambda p: {}, kind=Kind.CUSTOM, step="brokenstep:Step")
    with pytest.raises(PermanentJobError) as err:
        step_class(strategy)
    permanent, reason = classify(err.value)
    assert permanent and reason.startswith("strategy broken: its step brokenstep:Step cannot be loaded: SyntaxError")
