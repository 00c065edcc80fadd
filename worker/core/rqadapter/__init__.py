"""RQ behind one adapter: every use of RQ's API and persistence by decodebench, in this package.

Written against rq 3.0.0 (`RQ_VERSION`; tests/unit/worker/core/rqadapter/test_rq_adapter.py fails when the installed rq
is another): every field name, key, hook and private attribute in it is that version's. The
import-linter contract `rq-behind-the-adapter` (pyproject.toml) lets only this package import rq.

- `persistence`: job classes and queues per tenant, the job hashes submit writes in bulk,
  registries, lost jobs and due retries, the stop-job command, what a running job asks of RQ;
- `job`: `SealedJob`, RQ's Job that obeys nothing a client wrote into a job hash;
- `queue`: `ReliableQueue`, the worker's queue and its dequeue;
- `worker`: `HookedWorker`, RQ's SimpleWorker with its hooks overridden, calling decodebench's
  worker logic (injected: worker.core never imports worker.rq);
- `logic`: `WorkerLogic`, the base class of that logic, with defaults (a worker writes only its own).

Nothing outside this package touches an RQ job's fields: a job that fails for good goes through
`fail_for_good(job, reason)`, a failure's reason through `note_failure`.

The functions of `persistence` are re-exported here (`rqadapter.bulk_enqueue`, ...). RQ's key
names are built in `worker.core.keys` with the others.
"""

from __future__ import annotations

from worker.core.rqadapter.persistence import (
    PER_JOB_FIELDS,
    RQ_VERSION,
    SERIALIZER,
    DeserializationError,
    Status,
    bulk_enqueue,
    call_data,
    cancel_lost,
    current_job,
    drop_from_registries,
    drop_started,
    enqueue_due_retries,
    fail,
    fail_for_good,
    fetch,
    is_timeout,
    job_origins,
    job_statuses,
    job_template,
    jobs_exist,
    mark_canceled,
    meta_field,
    note_failure,
    queue_depths,
    queue_of,
    requeue_front,
    requeue_taken_not_started,
    retry,
    send_stop_job,
    tenant_job_class,
    tenant_job_counts,
    tenant_queue,
    worker_states,
)

__all__ = [
    "PER_JOB_FIELDS",
    "RQ_VERSION",
    "SERIALIZER",
    "DeserializationError",
    "Status",
    "bulk_enqueue",
    "call_data",
    "cancel_lost",
    "current_job",
    "drop_from_registries",
    "drop_started",
    "enqueue_due_retries",
    "fail",
    "fail_for_good",
    "fetch",
    "is_timeout",
    "job_origins",
    "job_statuses",
    "job_template",
    "jobs_exist",
    "mark_canceled",
    "meta_field",
    "note_failure",
    "queue_depths",
    "queue_of",
    "requeue_front",
    "requeue_taken_not_started",
    "retry",
    "send_stop_job",
    "tenant_job_class",
    "tenant_job_counts",
    "tenant_queue",
    "worker_states",
]
