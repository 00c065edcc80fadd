"""A chat sweep distributed (issue 38, part 1): examples/chat.yaml's model and prompts submitted to a real
redis-server, a `decodebench-worker` process taking the signed jobs, results in the loopback S3 endpoint.
Each job's conversation, system prompt and chat mode cross the JobSpec contract and come back in its
result.json as they were planned, with the template's record."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repo import REPO
from tests.support.services import SIGNING_KEY, s3_env

pytestmark = pytest.mark.slow
EXAMPLES = REPO / "examples"


def test_a_chat_sweep_runs_distributed_through_the_job_contract(redis_url, s3_bucket, s3_endpoint, tmp_path):
    import redis

    from controller.launch.submit import submit
    from controller.sweep.load import load_spec
    from controller.sweep.plan import plan
    from worker import sweepstate
    from worker.store import open_store

    spec = load_spec(EXAMPLES / "chat.yaml")
    spec.prompts.limit = 2
    spec.strategies = spec.strategies[:2]
    spec.generation.seeds = [0]
    spec.generation.max_new_tokens = 12
    url = f"s3://{s3_bucket}/runs"
    store, conn = open_store(url), redis.Redis.from_url(redis_url)
    out = submit(conn, store, spec, "default", key=SIGNING_KEY)
    planned = {j.job_id: j for j in plan(spec)}
    assert len(out.enqueued) == 4 and set(out.enqueued) == set(planned)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEBENCH_")}
    env.update(
        s3_env(s3_endpoint),
        DECODEBENCH_REDIS_URL=redis_url,
        DECODEBENCH_STORE=url,
        DECODEBENCH_SIGNING_KEY_FILE=os.environ["DECODEBENCH_SIGNING_KEY_FILE"],
        DECODEBENCH_LOG_FORMAT="json",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
    )
    log = (tmp_path / "worker.log").open("w")
    args = ["--device", "cpu", "--queues", "default", "--burst", "--name", "chat-worker"]
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "decodebench-worker"), *args], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        assert proc.wait(600) == 0, (tmp_path / "worker.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    status = sweepstate.read_status(conn, "default", out.sweep_id)
    assert status.complete and status.total("done") == 4, status.failures
    for job_id, job in planned.items():
        result = store.load_result("default", out.sweep_id, job_id)
        assert result.job == job  # messages, system and chat mode crossed the contract intact
        chat = job.model.chat is not False
        assert ("chat" in result.engine) == chat, job.cell
        if chat:
            assert result.job.model.system and result.job.prompts[0].messages is not None
            assert sum(result.engine["chat"]["prompt_tokens"].values()) == sum(b.input_tokens for b in result.batches)
