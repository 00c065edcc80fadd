"""What a job must show before the worker reads it: the submission server's signature.

The job class itself, which obeys nothing a client wrote into a job hash, is RQ's and lives in the
adapter (`worker.core.rqadapter.job`: `SealedJob`, `sealed_job_class`). Here:

- `signing_key`: the key of DECODEBENCH_SIGNING_KEY_FILE; without one a worker does not start;
- `unseal`: check the stored payload's signature (`decodebench_sig`, `worker.core.signing`) for
  this tenant and job id, then inflate it under the DECODEBENCH_MAX_JOB_MB cap; RQ's call tuple
  comes from that payload only, and the timeout is never longer than the payload's own `timeout_s`;
- `sealed_refusal`: `unseal`'s one-line reason, or None.
"""

from __future__ import annotations

import json

from worker.core import settings, signing
from worker.core.errors import PermanentJobError, UsageError, shown
from worker.core.rqadapter.job import SealedJob, open_payload, sealed_payload

__all__ = ["sealed_refusal", "signing_key", "unseal"]


def signing_key() -> bytes:
    """The job signing key of DECODEBENCH_SIGNING_KEY_FILE; without one a worker does not start."""
    path = settings.get("signing_key_file")
    if not path:
        raise UsageError(
            "DECODEBENCH_SIGNING_KEY_FILE is not set: workers run only jobs signed by the submission server"
        )
    return signing.load_key(path)


def unseal(job: SealedJob, key: bytes, limit: int) -> None:
    """Check the job's signature, then inflate its payload (at most `limit` bytes) and take RQ's
    call tuple from it. PermanentJobError with one line if any step fails; nothing is decoded
    before the signature verifies."""
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
