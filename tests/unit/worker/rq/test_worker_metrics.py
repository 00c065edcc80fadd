"""The worker's Prometheus metrics (worker.rq.metrics): a real `decodebench-worker --device cpu`
process serving /metrics on a loopback port while it runs real jobs (the bundled tiny model) from
a real redis-server; the exposition parsed with prometheus_client's own parser."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from tests.support.queue import spec_dict
from tests.support.services import SIGNING_KEY, free_port
from worker.core import keys
from worker.store import FileStore

BIN = Path(sys.executable).parent


def scrape(port: int) -> dict[str, list]:
    """Samples by name: [(labels, value)]."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


@pytest.fixture()
def worker_proc(redis_url, tmp_path, signing_key_file):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEBENCH_")}
    env.update(
        DECODEBENCH_REDIS_URL=redis_url,
        DECODEBENCH_STORE=str(tmp_path / "runs"),
        DECODEBENCH_SIGNING_KEY_FILE=signing_key_file,
        DECODEBENCH_METRICS_PORT=str(port),
        DECODEBENCH_POOL="cpu-pool",
        DECODEBENCH_REAPER_INTERVAL="0.5",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
    )
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", "default"], env=env, stdout=log, stderr=log
    )
    yield proc, port, tmp_path / "runs", tmp_path / "worker.log"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for(check, log: Path, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except OSError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def test_a_running_worker_serves_its_jobs_metrics(worker_proc, redis_url, tiny_model):
    proc, port, runs, log = worker_proc
    conn = redis.Redis.from_url(redis_url)
    store = FileStore(runs)
    good = cq.submit(
        conn, store, parse_spec(spec_dict(tiny_model, prompts=["A", "B"], seeds=(1,))), "default", key=SIGNING_KEY
    )
    bad = cq.submit(
        conn,
        store,
        parse_spec(spec_dict("/nonexistent/model", name="bad", prompts=["A", "B"], seeds=(1,))),
        "default",
        key=SIGNING_KEY,
    )
    n_good, n_bad = len(good.enqueued), len(bad.enqueued)

    def settled():
        s = scrape(port)
        done = total(s, "decodebench_worker_jobs_finished_total") + total(s, "decodebench_worker_jobs_failed_total")
        return s if done == n_good + n_bad else None

    s = wait_for(settled, log)
    pool = {"pool": "cpu-pool", "tenant": "default"}
    assert total(s, "decodebench_worker_jobs_started_total", **pool) == n_good + n_bad
    assert total(s, "decodebench_worker_jobs_finished_total", **pool) == n_good
    assert total(s, "decodebench_worker_jobs_failed_total", **pool) == n_bad  # the model is missing
    assert {lab["strategy"] for lab, _ in s["decodebench_worker_jobs_started_total"]} == {"greedy", "top_k"}
    assert {lab["engine"] for lab, _ in s["decodebench_worker_jobs_started_total"]} == {"decodebench"}
    assert total(s, "decodebench_worker_generated_tokens_total", **pool) > 0
    assert total(s, "decodebench_worker_job_tokens_per_second_count", **pool) == n_good
    assert total(s, "decodebench_worker_job_tokens_per_second_sum", **pool) > 0
    assert total(s, "decodebench_worker_job_duration_seconds_count", **pool) == n_good + n_bad
    assert total(s, "decodebench_worker_queue_wait_seconds_count", **pool) == n_good + n_bad
    assert total(s, "decodebench_worker_busy", pool="cpu-pool") == 0
    # Redis as it stands, read at scrape (a missing model fails for good: nothing left anywhere).
    queue = keys.queue_name("default")
    for state, n in (
        ("waiting", conn.llen(keys.rq_queue_key(queue))),
        ("running", conn.zcard(keys.rq_registry_key("wip", queue))),
        ("scheduled", conn.zcard(keys.rq_registry_key("scheduled", queue))),
    ):
        assert [v for lab, v in s["decodebench_queue_jobs"] if lab["state"] == state] == [n] == [0]
    conn.zadd(keys.rq_registry_key("scheduled", queue), {"a-retry": 2**40})  # a retry due far ahead
    assert total(scrape(port), "decodebench_queue_jobs", tenant="default", state="scheduled") == 1
    assert total(s, "decodebench_worker_gpu_memory_bytes") == 0  # a CPU worker
    assert s["process_start_time_seconds"][0][1] > 0  # a restarted process: a new value (crash-loop alert)
    # Bounded labels only: no job or sweep id anywhere.
    ids = {good.sweep_id, bad.sweep_id, *good.enqueued, *bad.enqueued}
    assert not {v for samples in s.values() for lab, _ in samples for v in lab.values()} & ids
    assert proc.poll() is None
