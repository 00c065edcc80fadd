"""`decodebench doctor`: one PASS/FAIL/NOTE line per check, non-zero exit when a required one fails."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from controller.cli import main as cli
from tests.support.services import free_port


def doctor(*args: str):
    return CliRunner().invoke(cli, ["doctor", *args])


def lines(output: str) -> dict[str, str]:
    out = {}
    for line in output.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0] in ("PASS", "FAIL", "NOTE"):
            out[parts[1]] = parts[0]
    return out


def test_everything_reachable_passes(redis_url, tmp_path):
    r = doctor("--redis-url", redis_url, "--store", str(tmp_path / "runs"))
    assert r.exit_code == 0, r.output
    checks = lines(r.output)
    assert checks["torch"] == "PASS" and checks["redis"] == "PASS" and checks["store"] == "PASS"
    assert checks["cuda"] == "NOTE"  # no GPU here: a note, not a failure
    assert "reachable and writable (Redis" in r.output and r.output.rstrip().endswith("all required checks passed")


def test_unreachable_redis_and_unwritable_store_fail(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = doctor("--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--store", str(blocker / "runs"))
    assert r.exit_code == 1
    checks = lines(r.output)
    assert checks["redis"] == "FAIL" and checks["store"] == "FAIL"
    assert "2 check(s) failed: redis, store" in r.output and "Traceback" not in r.output
    assert "`decodebench run` alone needs no Redis: doctor --local" in r.output  # a laptop's user is told


def test_local_mode_does_not_need_redis(tmp_path):
    r = doctor("--local", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--store", str(tmp_path / "runs"))
    assert r.exit_code == 0 and lines(r.output)["redis"] == "NOTE"


def test_gpu_required_but_absent_fails(redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    r = doctor("--require-gpu", "--redis-url", redis_url, "--store", str(tmp_path / "runs"))
    assert r.exit_code == 1 and lines(r.output)["cuda"] == "FAIL" and "CUDA not available" in r.output


def test_torch_absent_is_a_note_on_a_controller_only_install(redis_url, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    r = doctor("--redis-url", redis_url, "--store", str(tmp_path / "runs"))
    assert r.exit_code == 0, r.output
    assert lines(r.output)["torch"] == "NOTE" and "controller-only install" in r.output


def test_s3_store_check(s3_bucket):
    r = doctor("--local", "--store", f"s3://{s3_bucket}/runs")
    assert lines(r.output)["store"] == "PASS" and f"s3://{s3_bucket}/runs reachable and writable" in r.output


def test_the_controller_does_not_import_torch():
    code = (
        "import sys, controller.cli, controller.cli.distributed, controller.launch.submit, worker.sweepstate, "
        "worker.core.keys; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
