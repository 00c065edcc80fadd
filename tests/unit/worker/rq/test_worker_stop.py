"""An idle worker stops within seconds of SIGTERM and says what it did (issue 28, item 9).

A real `decodebench-worker` subprocess on a real redis-server, listening on one queue, so that it
blocks in Redis for a whole reaper interval (60 s here): before the stop signals were kept off the
helper threads, SIGTERM could land in one of them and the worker slept out the blocking pop."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from tests.support.workerprocs import BIN, GRACE_S, wait_for_line, worker_env


def test_idle_worker_stops_within_its_grace_and_logs_a_final_line(redis_url, tmp_path, signing_key_file):
    env = worker_env(redis_url, tmp_path, signing_key_file)
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", "decodebench.default.normal"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_line(log, "Worker", proc)  # RQ's own lines come once the main loop runs
        time.sleep(1)  # inside the blocking pop
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(GRACE_S)  # raises TimeoutExpired if it outlives its grace
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, log.read_text()[-3000:]
    stopped = [json.loads(x) for x in log.read_text().splitlines() if '"worker.stopped"' in x]
    assert len(stopped) == 1, log.read_text()[-3000:]
    assert stopped[0]["jobs_run"] == 0 and stopped[0]["jobs_failed"] == 0
    assert stopped[0]["uptime_s"] >= 1


def test_a_worker_whose_redis_stopped_first_still_stops_cleanly_with_its_final_line(tmp_path, signing_key_file):
    """docs/one-machine.md stops everything at once (`kill $(jobs -p)`): where Redis was gone by the worker's
    teardown, RQ's deregistration raised ConnectionError out of it, a traceback and no `worker.stopped` line
    (the clean-clone CI run of test_one_machine)."""
    from tests.support.services import redis_server

    log = tmp_path / "worker.log"
    with redis_server() as (url, redis_proc), log.open("w") as out:
        proc = subprocess.Popen(
            [str(BIN / "decodebench-worker"), "--device", "cpu", "--queues", "decodebench.default.normal"],
            env=worker_env(url, tmp_path, signing_key_file),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_line(log, "Worker", proc)
            time.sleep(1)  # inside the blocking pop
            proc.send_signal(signal.SIGTERM)  # as `kill $(jobs -p)` does: both at once
            redis_proc.kill()
            code = proc.wait(3 * GRACE_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert code == 0 and "Traceback" not in text, text[-3000:]
    assert sum('"worker.stopped"' in x for x in text.splitlines()) == 1, text[-3000:]
