"""A model that cannot load fails once, fast (issue 28, item 1).

Every model is resolved before the first job (no weights loaded); a hub id that cannot be had
(offline and not cached, unreachable, gated, not found) is named with its cause and its fix,
once, and its jobs are skipped while the other models' jobs run. Where the check is skipped, the
engine's first failure names the hub (not "its tokenizer") and marks the model unavailable.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner
from huggingface_hub import errors as hub_errors

from controller.cli import main
from tests.support.services import PROMPTS, TINY_MODEL
from worker.core.hub import unavailable_reason

MISSING = "decodebench-tests/no-such-model"  # never in any cache
SPEC = f"""
name: unavailable
models:
  - path: {TINY_MODEL}
  - path: {MISSING}
prompts:
  path: {PROMPTS}
  limit: 4
  shard_size: 2
strategies:
  - name: greedy
  - name: top_k
    params: {{k: 5}}
generation:
  max_new_tokens: 4
  seeds: [0, 1]
  warmup: false
"""


def _response(status: int):
    return httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/x"))


@pytest.mark.pure
@pytest.mark.parametrize(
    "err, expected",
    [
        (hub_errors.GatedRepoError("403", response=_response(403)), "a gated repo on the hub: accept its terms"),
        (hub_errors.RepositoryNotFoundError("404", response=_response(404)), "not found on the hub"),
        (hub_errors.RevisionNotFoundError("404", response=_response(404)), "that revision does not exist"),
        (hub_errors.LocalEntryNotFoundError("no connection"), "is unreachable and the model is not in the local cache"),
        (ConnectionError("Name or service not known"), "HF_HUB_OFFLINE=1, or give the model as a local path"),
        (ValueError("something else"), None),
    ],
    ids=["gated", "not-found", "revision", "unreachable", "connection", "other"],
)
def test_the_cause_and_the_fix_are_named_through_transformers_wrapping(err, expected, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        try:
            raise err
        except Exception as inner:
            raise OSError("We couldn't connect to load this file") from inner  # as transformers wraps it
    except OSError as wrapped:
        reason = unavailable_reason(wrapped)
    assert (reason is None) if expected is None else (expected in reason), reason


@pytest.mark.pure
def test_offline_and_not_cached_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reason = unavailable_reason(hub_errors.LocalEntryNotFoundError("offline"))
    assert reason.startswith("not in the local cache and HF_HUB_OFFLINE=1") and "local path" in reason


def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(SPEC)
    return path


def offline_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEBENCH_")}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "CUDA_VISIBLE_DEVICES": ""}


def decodebench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("decodebench"))
    return subprocess.run(
        [exe, "--log-level", "warning", *args], env=offline_env(tmp_path), capture_output=True, text=True, timeout=600
    )


def test_validate_check_models_names_each_model_and_fails_in_one_line(tmp_path):
    proc = decodebench(tmp_path, "validate", str(spec_file(tmp_path)), "--check-models")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"model 'austen-tiny' ({TINY_MODEL}): a local directory" in proc.stdout
    assert f"model 'no-such-model' ({MISSING}): unavailable: not in the local cache and HF_HUB_OFFLINE=1" in proc.stdout
    assert proc.stderr.strip() == "error: 1 of 2 models unavailable (see above)"


def test_validate_without_the_flag_does_not_ask_the_hub(tmp_path):
    res = CliRunner().invoke(main, ["validate", str(spec_file(tmp_path))])
    assert res.exit_code == 0 and "unavailable" not in res.output and "2 jobs, seeds [0]" in res.output


@pytest.mark.slow
@pytest.mark.parametrize("check", [True, False], ids=["checked-first", "engine-fails-once"])
def test_run_fails_the_model_once_and_runs_the_others(tmp_path, check):
    args = ["run", str(spec_file(tmp_path)), "--out", str(tmp_path / "runs")] + ([] if check else ["--no-check-models"])
    proc = decodebench(tmp_path, *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"6 jobs run, 0 already complete, {counts(check)}" in proc.stdout  # the local model's jobs all ran
    lines = proc.stderr.splitlines()
    reasons = [line for line in lines if "no-such-model" in line and "job.failed" not in line]  # not the log
    assert len(reasons) == 1, proc.stderr  # once, not once per job
    assert sum("job.failed" in line for line in lines) <= 1  # the engine tried it at most once
    assert "not in the local cache and HF_HUB_OFFLINE=1" in reasons[0] and "tokenizer" not in reasons[0]
    assert reasons[0].endswith(reason_counts(check))
    assert any(x.startswith("report: ") and x.endswith("report.html") for x in proc.stdout.splitlines())  # then next:


@pytest.mark.slow
@pytest.mark.parametrize("check", [True, False], ids=["checked-first", "engine-fails-once"])
def test_an_unreachable_hub_is_named_once_with_its_fix(tmp_path, check):
    """The issue's first finding: a hub that cannot be reached (here a closed loopback port as HF_ENDPOINT,
    not HF_HUB_OFFLINE) cost the client's retries for every job and blamed the tokenizer. Now the
    cause and the fix are one line, once, with no retry lines, and the other model's jobs run."""
    endpoint = closed_endpoint()
    env = {k: v for k, v in offline_env(tmp_path).items() if k != "HF_HUB_OFFLINE" and "proxy" not in k.lower()}
    args = ["run", str(spec_file(tmp_path)), "--out", str(tmp_path / "runs")] + ([] if check else ["--no-check-models"])
    exe = str(Path(sys.executable).with_name("decodebench"))
    proc = subprocess.run(
        [exe, "--log-level", "warning", *args], env={**env, "HF_ENDPOINT": endpoint}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"6 jobs run, 0 already complete, {counts(check)}" in proc.stdout
    reasons = [line for line in proc.stderr.splitlines() if "no-such-model" in line and "job.failed" not in line]
    assert len(reasons) == 1, proc.stderr
    assert f"the hub ({endpoint}) is unreachable and the model is not in the local cache" in reasons[0]
    assert "HF_HUB_OFFLINE=1, or give the model as a local path" in reasons[0] and "tokenizer" not in reasons[0]
    assert reasons[0].endswith(reason_counts(check)) and "Retrying" not in proc.stderr


def counts(checked_first: bool) -> str:
    """The run line's counts for the missing model's 6 jobs (docs/sweeps.md, "Models that cannot be had"): all
    skipped where the check before the first job found it; else its first job failed and the other 5 skipped."""
    return "0 failed, 6 skipped (model unavailable)" if checked_first else "1 failed, 5 skipped (model unavailable)"


def reason_counts(checked_first: bool) -> str:
    return "; 6 jobs skipped" if checked_first else "; 1 job failed, 5 jobs skipped"


def closed_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the block ends: refused at once


@pytest.mark.slow
def test_a_cached_hub_model_runs_from_the_cache_while_the_hub_is_unreachable(tmp_path):
    """The other side of the probe: a hub id whose files are in the local cache loads from it, without
    the client's retries, and the check says how to skip the probe next time."""
    snapshot = tmp_path / "hf" / "hub" / "models--decodebench-tests--cached-tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(TINY_MODEL, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC.replace(f"  - path: {TINY_MODEL}\n", "").replace(MISSING, "decodebench-tests/cached-tiny"))
    env = {k: v for k, v in offline_env(tmp_path).items() if k != "HF_HUB_OFFLINE" and "proxy" not in k.lower()}
    env["HF_ENDPOINT"] = closed_endpoint()
    exe = str(Path(sys.executable).with_name("decodebench"))
    check = subprocess.run([exe, "validate", str(spec), "--check-models"], env=env, capture_output=True, text=True)
    assert check.returncode == 0 and "in the local cache (the hub is unreachable: set HF_HUB_OFFLINE=1)" in check.stdout
    argv = [exe, "--log-level", "warning", "run", str(spec), "--out", str(tmp_path / "runs"), "--no-check-models"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "6 jobs run, 0 already complete, 0 failed" in proc.stdout and "Retrying" not in proc.stderr
