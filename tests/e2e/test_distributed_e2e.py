"""End to end with real processes: `decodebench submit`, three `decodebench-worker --device cpu
--burst` subprocesses on a real redis-server, and the bundled tiny model.

One scenario (run once for the module, to keep the suite fast) serves two tests: the
distributed store must hold what local mode (`decodebench run`) writes for the same spec,
and the worker SIGKILLed in the middle of the first job must not lose it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.workerprocs import BIN, env_for, start_workers, wait_all
from worker.core import keys
from worker.store import FileStore

pytestmark = pytest.mark.slow
QUALITY = [
    "n_prompts",
    "n_generations",
    "n_seeds",
    "mean_length",
    "rep_2",
    "distinct_1",
    "distinct_2",
    "diversity",
    "perplexity",
    "bleu",
    "rouge_l",
]


def write_spec(tmp_path: Path, model: str, prompts: str, name: str) -> Path:
    spec = {
        "name": name,
        "models": [{"path": model, "name": "tiny"}],
        "prompts": {"path": prompts, "limit": 6, "shard_size": 2},
        "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
        "generation": {"max_new_tokens": 8, "batch_size": 2, "seeds": [1, 2]},
        "metrics": ["mean_length", "rep_2", "distinct_1", "distinct_2", "diversity", "perplexity", "bleu", "rouge_l"],
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def submit(spec: Path, env: dict[str, str]) -> str:
    """The CLI once as a real subprocess."""
    r = subprocess.run(
        [str(BIN / "decodebench"), "submit", str(spec)], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("sweep ") and "submitted: 9 jobs on decodebench.default.normal" in r.stdout
    return r.stdout.split()[1]


def assert_each_generation_once(store: FileStore, sweep_id: str, n_jobs: int, n_generations: int) -> None:
    plan = store.read_json(f"default/sweeps/{sweep_id}/plan.json")["jobs"]
    assert store.complete_job_ids("default", sweep_id) == {j["job_id"] for j in plan} and len(plan) == n_jobs
    seen = []
    for job in plan:
        records = store.load_generations("default", sweep_id, job["job_id"])
        assert sorted(r.prompt_id for r in records) == sorted({r.prompt_id for r in records})
        assert len(records) == job["prompts"]
        seen += [(job["job_id"], r.prompt_id) for r in records]
    assert len(seen) == len(set(seen)) == n_generations


@dataclass
class Scenario:
    redis_url: str
    sweep_id: str
    store: FileStore
    local: FileStore
    ran_locally: list[str]
    procs: dict[str, subprocess.Popen]
    victim: str
    victim_job: str


def first_running_job(conn, sweep_id: str, timeout: float = 180) -> tuple[str, str]:
    """(job id, worker name) of the first job that starts: its worker is still loading the model."""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job_id, state in conn.hgetall(keys.sweep("default", sweep_id, "state")).items():
            worker_name = conn.hget(keys.rq_job_key("default", job_id.decode()), "worker_name")
            if state == b"running" and worker_name:
                return job_id.decode(), worker_name.decode()
        time.sleep(0.02)
    raise AssertionError("no job started")


@pytest.fixture(scope="module")
def scenario(redis_service, tiny_model, prompts_file, tmp_path_factory, signing_key_file) -> Scenario:
    """One sweep, three worker processes; the worker that starts the first job is SIGKILLed in
    the middle of it; meanwhile local mode runs the same spec in this process."""
    import redis
    import torch

    from controller.launch.local import run_sweep
    from controller.sweep.load import load_spec

    conn = redis.Redis.from_url(redis_service)
    conn.flushall()
    tmp = tmp_path_factory.mktemp("e2e")
    spec = write_spec(tmp, tiny_model, prompts_file, "e2e")
    env = env_for(redis_service, tmp / "dist", signing_key_file)
    sweep_id = submit(spec, env)
    procs = start_workers(3, env, tmp)
    try:
        victim_job, victim = first_running_job(conn, sweep_id)
        procs[victim].send_signal(signal.SIGKILL)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the same arithmetic as the workers (OMP_NUM_THREADS=1)
        try:
            local = FileStore(tmp / "local")
            outcome = run_sweep(load_spec(spec), local, device="cpu", progress=False)
        finally:
            torch.set_num_threads(threads)
        assert outcome.sweep_id == sweep_id and not outcome.failed
    finally:
        wait_all(procs, tmp)
    return Scenario(redis_service, sweep_id, FileStore(tmp / "dist"), local, outcome.ran, procs, victim, victim_job)


def test_distributed_sweep_equals_local_mode(scenario):
    from controller.cli import main as cli
    from controller.report.compute.aggregate import summarize
    from controller.report.load.sweep import load_sweep

    sweep_id, store, local = scenario.sweep_id, scenario.store, scenario.local
    r = CliRunner().invoke(cli, ["status", sweep_id, "--redis-url", scenario.redis_url])
    assert r.exit_code == 0 and "9/9 jobs done" in r.output and "complete" in r.output, r.output
    assert len(scenario.ran_locally) == 9
    for job_id in scenario.ran_locally:  # greedy token for token; seeded sampling too
        want = [(g.prompt_id, g.seed, g.token_ids, g.text) for g in local.load_generations("default", sweep_id, job_id)]
        got = [(g.prompt_id, g.seed, g.token_ids, g.text) for g in store.load_generations("default", sweep_id, job_id)]
        assert got == want, f"job {job_id} differs"
    a = summarize(load_sweep(local, "default", sweep_id), n_boot=20).set_index(["model", "strategy", "params"])
    b = summarize(load_sweep(store, "default", sweep_id), n_boot=20).set_index(["model", "strategy", "params"])
    assert a[QUALITY].equals(b[QUALITY])


def test_a_worker_killed_mid_job_loses_nothing(scenario):
    import redis

    from worker.sweepstate import read_status

    conn = redis.Redis.from_url(scenario.redis_url)
    assert scenario.procs[scenario.victim].returncode == -signal.SIGKILL
    assert all(p.returncode == 0 for name, p in scenario.procs.items() if name != scenario.victim)
    assert int(conn.hget(keys.lost("default"), scenario.victim_job)) == 1  # detected and requeued once
    s = read_status(conn, "default", scenario.sweep_id)
    # lost >= 1: on a starved machine a live worker can miss its 5 s heartbeat too; its job then
    # runs twice, and the store must still hold every generation once
    assert s.complete and s.total("done") == 9 and s.n_failures == 0 and s.lost >= 1
    assert_each_generation_once(scenario.store, scenario.sweep_id, 9, 6 * 3)
    result = scenario.store.load_result("default", scenario.sweep_id, scenario.victim_job)
    assert result.n_generations == 2 and result.provenance["device"]["device"] == "cpu"
