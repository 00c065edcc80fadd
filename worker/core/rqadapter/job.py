"""The worker's job class: RQ's Job that obeys nothing a client wrote into a job hash (rq 3.0.0).

RQ's `Job.restore` takes every field of the hash at its word: callback names it later
imports and calls, webhooks it POSTs to, dependency ids it deletes or enqueues, the origin
queue whose registries it writes, TTLs, and a `data` field it inflates without bound.
`SealedJob.restore` reads only what decodebench needs:

- `data` is kept as stored, neither decompressed nor decoded, until decodebench has checked its
  signature (`unseal`, below, which both the GPU worker and the report worker run); RQ's call
  tuple comes from that payload only, and the function run is the queue's (`keys.queue_function`:
  `keys.RQ_FUNCTION`, or `keys.REPORT_FUNCTION` on the tenant's report queue);
- the origin is one of the tenant's own queues (its report queue included) (the dequeuing worker forces the queue it
  took the job from); result and failure TTLs are decodebench's (`keys`); retries are
  bounded (`MAX_RETRIES`, intervals of at most a day);
- callbacks, webhooks, dependencies, `ttl`, `group_id`, `enqueue_at_front`, repeats, rate
  limits and any other field are ignored; a save writes the stored `data` back byte for byte
  (so the signature still verifies on a retry) and clears the callback names.

`sealed_job_class(tenant)` is the per-tenant class (key prefix `rq:job:<tenant>:`, as
`tenant_job_class`); the worker's queues, registries, reaper and retries all use it.
"""

from __future__ import annotations

import functools
import json

from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import UNEVALUATED, Job, JobStatus
from rq.utils import decode_redis_hash, import_attribute, now, str_to_date

from worker.core import keys, signing
from worker.core.errors import PermanentJobError, shown
from worker.core.rqadapter.persistence import tenant_job_class
from worker.core.settings import check_tenant

MAX_RETRIES = 10  # retries a job hash may ask for at most (decodebench's default: 3)
MAX_RETRY_INTERVAL_S = 24 * 3600
MAX_DESCRIPTION = 200
MAX_META = 64 * 1024  # decodebench's meta is a few ids and a reason: a larger one is left unread


def _text(value: bytes | None, limit: int = 200) -> str | None:
    return value.decode("utf-8", "replace")[:limit] if value else None


def _date(value: bytes | None):
    try:
        return str_to_date(value) if value else None
    except (ValueError, TypeError):
        return None


def _int(value: bytes | None, lo: int, hi: int) -> int | None:
    try:
        return min(max(int(value), lo), hi) if value else None
    except (ValueError, TypeError):
        return None


def _intervals(value: bytes | None) -> list[int] | None:
    try:
        raw = json.loads(value) if value else None
    except ValueError:
        return None
    if not isinstance(raw, list) or not raw:
        return None
    out = [min(max(v, 0), MAX_RETRY_INTERVAL_S) for v in raw[:MAX_RETRIES] if type(v) is int]
    return out or None


class SealedJob(Job):
    tenant = ""  # set by sealed_job_class
    # why the dequeuing worker will not run this job (its signature, the tenant's policy), or None:
    # set by HookedWorker.perform_job, read by its prepare_job_execution, which RQ calls in between
    refusal: str | None = None

    def restore(self, raw_data) -> None:
        obj = decode_redis_hash(raw_data)
        if "data" not in obj:
            raise NoSuchJobError(f"job {self.id}: no data field")
        self._stored = obj["data"]
        self._sig = obj.get(signing.SIG_FIELD)
        self._opened = False
        self._data = self._func_name = self._instance = self._args = self._kwargs = UNEVALUATED
        self.created_at = _date(obj.get("created_at")) or now()
        self.enqueued_at = _date(obj.get("enqueued_at"))
        self.started_at = _date(obj.get("started_at"))
        self.ended_at = _date(obj.get("ended_at"))
        self.last_heartbeat = _date(obj.get("last_heartbeat"))
        self.worker_name = _text(obj.get("worker_name"))
        self.description = _text(obj.get("description"), MAX_DESCRIPTION)
        origin = _text(obj.get("origin")) or ""
        own = [*keys.tenant_queues(self.tenant), keys.report_queue(self.tenant)] if self.tenant else [""]
        self.origin = origin if origin in own else (keys.queue_name(self.tenant) if self.tenant else "")
        try:
            self._status = JobStatus(_text(obj.get("status")) or JobStatus.CREATED)
        except ValueError:
            self._status = JobStatus.CREATED
        self.timeout = _int(obj.get("timeout"), 1, 365 * 24 * 3600)
        self.result_ttl, self.failure_ttl = keys.RESULT_TTL, keys.FAILURE_TTL
        self._read_meta(obj.get("meta"))
        self.retries_left = _int(obj.get("retries_left"), 0, MAX_RETRIES)
        self.number_of_retries = _int(obj.get("number_of_retries"), 0, MAX_RETRIES)
        self.retry_intervals = _intervals(obj.get("retry_intervals"))

    def _read_meta(self, raw: bytes | None) -> None:
        self._unreadable_meta = None
        try:
            meta = self.serializer.loads(raw) if raw and len(raw) <= MAX_META else ({} if not raw else None)
        except Exception:  # as RQ: kept unread, written back as it was
            meta = None
        if not isinstance(meta, dict):
            meta, self._unreadable_meta = {"unserialized": raw}, raw
        self.meta = meta

    def _deserialize_data(self) -> None:
        if not getattr(self, "_opened", True):
            raise DeserializationError() from PermanentJobError("the job's payload is not verified")
        super()._deserialize_data()

    @property
    def func(self):
        if not getattr(self, "_opened", True):
            raise PermanentJobError("the job's payload is not verified")
        # the one function a job of its queue calls (generation or report cell), whatever the payload names
        return import_attribute(keys.queue_function(self.tenant, self.origin) if self.tenant else keys.RQ_FUNCTION)

    def to_dict(self, include_meta: bool = True, include_result: bool = True) -> dict:
        """RQ's fields, with the `data` as it was stored (its signature still holds)."""
        stored = getattr(self, "_stored", None)
        if stored is None:
            return super().to_dict(include_meta=include_meta, include_result=include_result)
        saved = self._data
        self._data = b""  # RQ's to_dict compresses self.data: never re-encode what was signed
        try:
            obj = super().to_dict(include_meta=include_meta, include_result=include_result)
        finally:
            self._data = saved
        obj["data"] = stored
        return obj


def return_value(job: Job):
    """What the job's function returned, as RQ keeps it after a run (None if it did not finish)."""
    return getattr(job, "_result", None)


def sealed_payload(job: SealedJob) -> tuple[bytes, bytes | None] | None:
    """(the stored `data`, its signature) of a job whose payload is not opened yet, else None."""
    if getattr(job, "_opened", True):
        return None
    return job._stored, job._sig


def open_payload(job: SealedJob, call: list, raw: bytes) -> None:
    """RQ's call tuple (function, instance, args, kwargs) from the verified, inflated payload `raw`."""
    job._func_name, job._instance, job._args, job._kwargs = call
    job._data, job._opened = raw, True


@functools.cache
def sealed_job_class(tenant: str) -> type[SealedJob]:
    """The tenant's SealedJob, a subclass of `tenant_job_class(tenant)` (key prefix `rq:job:<tenant>:`)."""
    bases = (SealedJob, tenant_job_class(tenant))
    return type(f"SealedJob_{tenant}", bases, {"tenant": check_tenant(tenant)})


def unseal(job: SealedJob, key: bytes, limit: int) -> None:
    """Check the job's signature, then inflate its payload (at most `limit` bytes) and take RQ's
    call tuple from it. PermanentJobError with one line if any step fails; nothing is decoded
    before the signature verifies. (Here, not in worker.rq, so that the report worker, a
    controller process, checks its jobs with the very same code.)"""
    sealed = sealed_payload(job)
    if sealed is None:
        return
    stored, sig = sealed
    if not sig:
        raise PermanentJobError("refused: the job is not signed (workers run only jobs the submission server signed)")
    if not signing.verify(key, job.tenant, job.id, stored, sig):
        raise PermanentJobError(f"refused: the job's signature does not verify for tenant {job.tenant} and this job")
    raw = signing.inflate(stored, limit)
    try:
        call = json.loads(raw)
    except ValueError as err:
        raise PermanentJobError(f"refused: the job's payload is not readable JSON ({shown(str(err), 120)})") from None
    if not isinstance(call, list) or len(call) != 4:
        raise PermanentJobError("refused: the job's payload is not readable JSON (not an RQ call)")
    open_payload(job, call, raw)
    args = call[2]  # (function, instance, args, kwargs)
    spec = args[0] if isinstance(args, list) and args and isinstance(args[0], dict) else {}
    own = spec.get("timeout_s")
    if isinstance(own, int) and not isinstance(own, bool) and own > 0:  # the hash may only shorten it
        job.timeout = min(job.timeout or own, own)


def sealed_refusal(job, key: bytes, limit: int) -> str | None:
    """`unseal`'s one-line reason if the job's payload may not even be read, else None."""
    try:
        unseal(job, key, limit)
    except PermanentJobError as err:
        return str(err).strip().splitlines()[0]
    return None
