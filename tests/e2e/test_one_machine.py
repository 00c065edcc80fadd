"""docs/one-machine.md, run: its `bash` blocks in order, in one shell, with real processes on
loopback (redis-server, moto's S3 server, decodebench serve, two workers), on free ports instead
of the page's 6379, 5000 and 8080. The page cannot rot: a command that stops working fails here.
Also: `submit` against a bucket that does not exist is one line and exit 2."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.repo import REPO
from tests.support.services import free_port, s3_env

PAGE = REPO / "docs" / "one-machine.md"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)


def test_the_page_runs_as_written(tmp_path):
    for tool in ("redis-server", "redis-cli", "curl"):
        assert shutil.which(tool), f"{tool} is not installed (scripts/setup-test-deps.sh)"
    script = "\n".join(blocks(PAGE.read_text()))
    assert "rq info --url" in script and "decodebench serve" in script and script.count("decodebench-worker") == 1
    for port in ("6379", "5000", "8080"):
        script = script.replace(port, str(free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DECODEBENCH_", "AWS_"))}
    env.update(PATH=f"{BIN}:{env['PATH']}", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", TMPDIR=str(tmp_path))
    run = tmp_path / "page.sh"
    # on any failure, or the time running out: stop what the page started, show its logs
    run.write_text(
        "set -euo pipefail\ntrap 'st=$?; kill $(jobs -p) 2>/dev/null || true; "
        '[ $st = 0 ] || tail -n 20 "$PWD"/*.log >&2; exit $st\' EXIT\n' + script
    )
    proc = subprocess.run(
        ["bash", str(run)], cwd=REPO, env=env, capture_output=True, text=True, timeout=540, start_new_session=True
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert re.search(r"sweep [0-9a-f]+ submitted: \d+ jobs", out), out[-3000:]
    assert "| top_p(p=0.8) " in out or "top_p" in out  # the report's table
    assert "decodebench.default.normal" in out and "2 workers" in out, out[-3000:]
    logs = list(tmp_path.glob("tmp.*/w*.log"))
    assert len(logs) == 2 and all("worker.stopped" in p.read_text() for p in logs)
    # the final lines count what the workers did: every job of the sweep, none failed
    ran = [int(n) for p in logs for n in re.findall(r"worker\.stopped.*jobs_run=(\d+)", p.read_text())]
    submitted = int(re.search(r"submitted: (\d+) jobs", out).group(1))
    assert sum(ran) == submitted and all("jobs_failed=0" in p.read_text() for p in logs)


def test_submit_to_a_missing_bucket_is_one_line_and_exit_2(tmp_path, monkeypatch, s3_endpoint, redis_url):
    from controller.cli import main

    for k, v in s3_env(s3_endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("DECODEBENCH_STORE", "s3://no-such-bucket/demo")
    monkeypatch.setenv("DECODEBENCH_REDIS_URL", redis_url)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        f"name: missing\nmodels: [{{path: {REPO}/examples/models/austen-tiny}}]\n"
        f"prompts: {{path: {REPO}/examples/prompts/austen-heldout.jsonl, limit: 2}}\n"
        "strategies: [{name: greedy}]\n"
    )
    result = CliRunner().invoke(main, ["submit", str(spec)], prog_name="decodebench")
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "bucket 'no-such-bucket'" in lines[0] and "does not exist" in lines[0], result.output


def test_submit_through_the_server_to_a_missing_bucket_is_one_line_and_exit_2(
    tmp_path, s3_endpoint, redis_url, signing_key_file
):
    from tests.support.server import deployment

    model = f"{REPO}/examples/models/austen-tiny"
    extra = {**s3_env(s3_endpoint), "DECODEBENCH_STORE": "s3://no-such-bucket/demo"}
    with deployment(tmp_path / "server", redis_url, signing_key_file, model, **extra) as dep:
        spec = tmp_path / "sweep.yaml"
        spec.write_text(
            f"name: missing\nmodels: [{{path: {model}}}]\n"
            f"prompts: {{path: {REPO}/examples/prompts/austen-heldout.jsonl, limit: 2}}\n"
            "strategies: [{name: greedy}]\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEBENCH_")}
        env["DECODEBENCH_TOKEN"] = dep.tokens["bob"]
        proc = subprocess.run(
            [str(BIN / "decodebench"), "submit", str(spec), "--api", dep.url],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    assert len(lines) == 1 and "bucket 'no-such-bucket'" in lines[0] and "does not exist" in lines[0], lines
