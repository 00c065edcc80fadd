"""A small sweep submitted to a real redis-server as the submission server does (signed with the session's
key), and the RQ queue its jobs wait on: for the queue, worker, fairness and hostile tests."""

from __future__ import annotations

from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from tests.support.services import SIGNING_KEY as KEY
from worker.core import keys, rqadapter

PROMPTS = ["It is a truth universally", "She was not", "The house was", "Mr. Darcy said", "In the morning"]


def spec_dict(
    model: str = "/nonexistent/model",
    *,
    name: str = "qtest",
    prompts=PROMPTS,
    shard_size: int = 2,
    seeds=(1, 2),
    models=None,
) -> dict:
    return {
        "name": name,
        "models": models or [{"path": model, "name": "m"}],
        "prompts": {"inline": list(prompts), "shard_size": shard_size},
        "strategies": [{"name": "greedy"}, {"name": "top_k", "params": {"k": 5}}],
        "generation": {"max_new_tokens": 4, "batch_size": 2, "seeds": list(seeds), "warmup": False},
        "metrics": ["distinct_1"],
    }


def submit(conn, store, tenant="default", **kw):
    spec = parse_spec(spec_dict(**kw))
    return cq.submit(conn, store, spec, tenant, key=KEY)


def rq_queue(conn, tenant="default", priority="normal"):
    from rq import Queue
    from rq.serializers import JSONSerializer

    return Queue(
        keys.queue_name(tenant, priority),
        connection=conn,
        serializer=JSONSerializer,
        job_class=rqadapter.tenant_job_class(tenant),  # job hashes live under rq:job:<tenant>:
    )


def submit_tenant_jobs(conn, store, tenant: str, n_jobs: int, name: str):
    """A tenant's sweep of `n_jobs` jobs (one prompt and one seed a job, both strategies), submitted."""
    spec = spec_dict(name=name, prompts=[f"p{i}" for i in range(n_jobs // 2)], shard_size=1, seeds=(1,))
    return cq.submit(conn, store, parse_spec(spec), tenant, key=KEY)
