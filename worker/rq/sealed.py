"""What a job must show before the worker reads it: the submission server's signature.

The job class itself, which obeys nothing a client wrote into a job hash, is RQ's and lives in the
adapter (`worker.core.rqadapter.job`: `SealedJob`, `sealed_job_class`). Here:

- `signing_key`: the key of DECODEBENCH_SIGNING_KEY_FILE; without one a worker does not start;
- `unseal` (in the adapter, `worker.core.rqadapter.job`, shared with the report worker): check the
  stored payload's signature (`decodebench_sig`, `worker.core.signing`) for this tenant and job id,
  then inflate it under the DECODEBENCH_MAX_JOB_MB cap; RQ's call tuple comes from that payload only,
  and the timeout is never longer than the payload's own `timeout_s`;
- `sealed_refusal`: `unseal`'s one-line reason, or None.
"""

from __future__ import annotations

from worker.core import settings, signing
from worker.core.errors import UsageError
from worker.core.rqadapter.job import sealed_refusal, unseal

__all__ = ["sealed_refusal", "signing_key", "unseal"]


def signing_key() -> bytes:
    """The job signing key of DECODEBENCH_SIGNING_KEY_FILE; without one a worker does not start."""
    path = settings.get("signing_key_file")
    if not path:
        raise UsageError(
            "DECODEBENCH_SIGNING_KEY_FILE is not set: workers run only jobs signed by the submission server"
        )
    return signing.load_key(path)
