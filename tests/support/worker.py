"""In-process RQ workers on the test's redis-server (the tiny bundled model on CPU, failure detection
shortened), forged job hashes as a client with Redis access could write them, and a failed job's reason."""

from __future__ import annotations

import functools
import time
import zlib

from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from tests.support.queue import rq_queue, spec_dict
from tests.support.services import SIGNING_KEY as KEY
from worker.core import keys, signing
from worker.rq.reaper import Timing

FAST = Timing(heartbeat_ttl=5.0, reaper_interval=0.3, max_lost=3)


@functools.cache
def cpu_runtime():
    """The in-process workers' runtime: one model cache for the session, as in a worker process."""
    from worker.engine.job import Runtime

    return Runtime("cpu")


def make_worker(conn, selectors=("default",), **kw):
    from worker.rq.worker import decodebench_worker
    from worker.store import open_store

    return decodebench_worker(
        list(selectors),
        connection=conn,
        store=kw.pop("store", None) or open_store(),
        runtime=cpu_runtime(),
        timing=kw.pop("timing", FAST),
        **kw,
    )


def run_worker(conn, selectors=("default",), max_jobs=None, **kw):
    worker = make_worker(conn, selectors, **kw)
    worker.work(burst=True, max_jobs=max_jobs)
    return worker


def submit(conn, store, model: str, **kw):
    return cq.submit(conn, store, parse_spec(spec_dict(model, **kw)), "default", key=KEY)


def wait_for(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def conn_url(conn) -> str:
    kw = conn.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def plant(conn, job_id: str, data: bytes, tenant: str = "default", *, key: bytes | None = KEY, **fields) -> None:
    """Write `data` (uncompressed) into a job hash as the server would store it: compressed, and
    signed with `key` (None: unsigned); `fields` are written beside it."""
    stored = zlib.compress(data)
    sig = {signing.SIG_FIELD: signing.sign(key, tenant, job_id, stored)} if key else {}
    conn.hset(keys.rq_job_key(tenant, job_id), mapping={"data": stored, **sig, **fields})


def reason(conn, job_id: str, tenant: str = "default") -> str:
    job = rq_queue(conn, tenant).fetch_job(job_id)
    assert job is not None and job.get_status() == "failed", job_id
    assert job.retries_left == 0 and not job.number_of_retries, job_id  # failed for good, at the first try
    return job.meta["reason"]
