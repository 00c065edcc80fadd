"""Enqueue a 100,000-job sweep and ask for its status, on a real redis-server on loopback.

    python benchmarks/bench_enqueue.py                  # 100,000 jobs
    python benchmarks/bench_enqueue.py --jobs 20000     # smaller

Side by side in one run:
- enqueue: decodebench's `enqueue_jobs` (what `submit` does: all jobs, 5,000 per round
  trip, one Lua call per chunk for the jobs' states and one for RQ's job hashes) against
  RQ's own pipelined `Queue.enqueue_many` and RQ's one-call-per-job `Queue.enqueue`, each
  on a sample of `--sample` jobs (jobs/s, and the ratios);
- status: `decodebench status` (`read_status`: counters, O(cells)) against a status
  computed by reading every job's state (HGETALL of the 100,000-entry state hash), the
  cheapest way to count without counters; median of `--repeat` calls each;
- resubmission (idempotent: nothing enqueued) and cancel of the whole sweep.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.launch.submit import enqueue_jobs
from controller.sweep.load import parse_spec
from controller.sweep.plan import plan
from tests.support.services import redis_server
from worker.core import keys
from worker.sweepstate import cancel_sweep, read_status


def make_jobs(n_jobs: int):
    prompts = [f"Prompt {i}: it is a truth universally acknowledged" for i in range(n_jobs // 2)]
    spec = parse_spec(
        {
            "name": "bench-enqueue",
            "models": [{"path": "/models/a", "name": "a"}],
            "prompts": {"inline": prompts, "shard_size": 1},
            "strategies": [{"name": "greedy"}, {"name": "top_k", "params": {"k": 40}}],
            "generation": {"max_new_tokens": 64, "seeds": [0]},
        }
    )
    return plan(spec, "bench")


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def naive_status(conn, tenant: str, sweep_id: str) -> Counter:
    states = conn.hgetall(keys.sweep(tenant, sweep_id, "state"))
    cells = conn.hgetall(keys.sweep(tenant, sweep_id, "cells"))
    return Counter((cells[j], s) for j, s in states.items())


def compare_with_rq(conn, sample, n_jobs: int, rate: float, t_enqueue: float, memory: float) -> None:
    """RQ's own enqueue paths on a sample of the jobs, printed beside decodebench's rate."""
    from rq import Queue
    from rq.serializers import JSONSerializer

    q = Queue("bench-plain", connection=conn, serializer=JSONSerializer)
    start = time.perf_counter()
    for job in sample:
        q.enqueue(
            keys.RQ_FUNCTION, job.model_dump(mode="json"), job_id=f"plain-{job.job_id}", job_timeout=job.timeout_s
        )
    t_plain = time.perf_counter() - start
    plain_rate = len(sample) / t_plain
    q = Queue("bench-many", connection=conn, serializer=JSONSerializer)
    start = time.perf_counter()
    with conn.pipeline() as pipe:
        q.enqueue_many(
            [
                Queue.prepare_data(
                    keys.RQ_FUNCTION,
                    args=(job.model_dump(mode="json"),),
                    job_id=f"many-{job.job_id}",
                    timeout=job.timeout_s,
                )
                for job in sample
            ],
            pipeline=pipe,
        )
        pipe.execute()
    t_many = time.perf_counter() - start
    many_rate = len(sample) / t_many
    print(
        f"enqueue, decodebench submit      : {n_jobs:>7,} jobs in {t_enqueue:6.2f} s = {rate:9,.0f} jobs/s "
        f"(Redis memory {memory:,.0f} MiB)"
    )
    print(
        f"enqueue, RQ enqueue_many pipelined: {len(sample):>7,} jobs in {t_many:6.2f} s = {many_rate:9,.0f} jobs/s "
        f"(projected {n_jobs / many_rate:,.0f} s for all)"
    )
    print(
        f"enqueue, RQ one call per job     : {len(sample):>7,} jobs in {t_plain:6.2f} s = {plain_rate:9,.0f} jobs/s "
        f"(projected {n_jobs / plain_rate:,.0f} s for all)"
    )
    print(
        f"  decodebench / RQ enqueue_many = {rate / many_rate:.1f}x, "
        f"decodebench / one-by-one = {rate / plain_rate:.1f}x"
    )


def compare_status(conn, jobs, repeat: int) -> None:
    """`decodebench status` (counters) against reading every job's state, medians of `repeat` calls."""
    sweep_id = jobs[0].sweep_id
    ours, theirs = [], []
    for _ in range(repeat):
        s, t = timed(read_status, conn, "bench", sweep_id)
        ours.append(t)
        counts, t = timed(naive_status, conn, "bench", sweep_id)
        theirs.append(t)
    assert s.total("queued") == len(jobs) == sum(counts.values())
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    print(f"status from counters (decodebench status): median {m_ours * 1000:8.2f} ms over {repeat} calls")
    print(f"status by reading every job's state     : median {m_theirs * 1000:8.2f} ms over {repeat} calls")
    print(f"  per-job scan / counters = {m_theirs / m_ours:.0f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--sample", type=int, default=2_000, help="jobs enqueued one call at a time with plain RQ")
    p.add_argument("--repeat", type=int, default=20, help="status calls per side")
    args = p.parse_args()

    import redis
    from rq import Queue

    jobs, t_plan = timed(make_jobs, args.jobs)
    print(f"enqueue benchmark: {len(jobs):,} jobs, 2 cells; python {sys.version.split()[0]}")
    print(f"plan (pydantic JobSpecs, not Redis): {t_plan:.2f} s")
    with redis_server() as (url, _):
        conn = redis.Redis.from_url(url)
        version = conn.info("server")["redis_version"]
        print(f"redis-server {version} on loopback")

        out, t_enqueue = timed(
            enqueue_jobs, conn, jobs, "bench", "normal", key=b"decodebench-benchmark-signing-key-0123456789"
        )
        assert len(out.enqueued) == len(jobs)
        rate = len(jobs) / t_enqueue
        memory = conn.info("memory")["used_memory"] / 2**20

        compare_with_rq(conn, jobs[: args.sample], len(jobs), rate, t_enqueue, memory)

        again, t_again = timed(
            enqueue_jobs, conn, jobs, "bench", "normal", key=b"decodebench-benchmark-signing-key-0123456789"
        )
        assert again.enqueued == [] and again.pending == len(jobs)
        print(f"resubmit (idempotent, 0 enqueued): {t_again:.2f} s")

        compare_status(conn, jobs, args.repeat)

        result, t_cancel = timed(cancel_sweep, conn, "bench", jobs[0].sweep_id)
        assert result.cancelled == len(jobs) and Queue(out.queue, connection=conn).count == 0
        print(f"cancel (all {len(jobs):,} queued jobs dropped from the queue): {t_cancel:.2f} s")


if __name__ == "__main__":
    main()
