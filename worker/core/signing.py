"""Signed job payloads: a worker runs only what the submission server (or an operator's
`decodebench submit`) signed, and never inflates more than it was told to expect.

The signature is HMAC-SHA256 over

    b"decodebench/job/v1\\n" + tenant + b"\\n" + job_id + b"\\n" + data

where `data` is the exact `data` field of the RQ job hash as stored (zlib-compressed JSON):
the worker checks it before it decompresses a byte. The hex signature is stored beside it,
in the job hash's field `decodebench_sig` (`SIG_FIELD`). The key is a file shared by the
server and the workers (DECODEBENCH_SIGNING_KEY_FILE; the chart mounts a Secret), at least
32 bytes. Binding the tenant and the job id means a signature copied onto another job, or
another tenant's queue, does not verify.
"""

from __future__ import annotations

import hashlib
import hmac
import zlib
from pathlib import Path

from worker.core.errors import PermanentJobError, UsageError

SIG_FIELD = "decodebench_sig"
DOMAIN = b"decodebench/job/v1\n"
MIN_KEY_BYTES = 32
CHUNK = 64 * 1024  # compressed bytes fed to the decompressor per step


def load_key(path: str | Path | None) -> bytes:
    """The signing key held in the file at `path` (surrounding whitespace dropped); a one-line
    UsageError if the path is unset, the file unreadable or the key shorter than 32 bytes."""
    if not path:
        raise UsageError("DECODEBENCH_SIGNING_KEY_FILE is not set: give the file holding the job signing key")
    p = Path(path)
    try:
        key = p.read_bytes().strip()
    except OSError as err:
        raise UsageError(f"{p}: cannot read the signing key file: {err.strerror or type(err).__name__}") from None
    if len(key) < MIN_KEY_BYTES:
        raise UsageError(f"{p}: the signing key is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes")
    return key


def _message(tenant: str, job_id: str, data: bytes) -> bytes:
    return DOMAIN + tenant.encode() + b"\n" + job_id.encode() + b"\n" + bytes(data)


def sign(key: bytes, tenant: str, job_id: str, data: bytes) -> str:
    """The hex HMAC-SHA256 of a job's stored `data` for `tenant` and `job_id`."""
    return hmac.new(key, _message(tenant, job_id, data), hashlib.sha256).hexdigest()


def verify(key: bytes, tenant: str, job_id: str, data: bytes, sig: str | bytes | None) -> bool:
    """Whether `sig` is the signature of `data` for `tenant` and `job_id` (constant-time compare)."""
    if isinstance(sig, bytes):
        try:
            sig = sig.decode("ascii")
        except UnicodeDecodeError:
            return False
    if not isinstance(sig, str) or not isinstance(data, (bytes, bytearray)):
        return False
    return hmac.compare_digest(sign(key, tenant, job_id, data).encode(), sig.encode("ascii", "replace"))


def inflate(data: bytes, limit: int) -> bytes:
    """zlib-decompress `data`, holding at most `limit` output bytes at any time.

    Raises PermanentJobError naming the limit if the payload would inflate past it, or if it
    is not a complete zlib stream (trailing bytes included)."""
    d = zlib.decompressobj()
    out = bytearray()
    view = memoryview(data)
    try:
        for start in range(0, len(view), CHUNK):
            chunk = view[start : start + CHUNK]
            while chunk:
                out += d.decompress(chunk, limit + 1 - len(out))  # max_length: never more than the cap
                if len(out) > limit:
                    raise PermanentJobError(_over(limit))
                chunk = d.unconsumed_tail
        while not d.eof and (more := d.decompress(b"", limit + 1 - len(out))):
            out += more
            if len(out) > limit:
                raise PermanentJobError(_over(limit))
    except zlib.error as err:
        raise PermanentJobError(f"the job's payload is not zlib data ({err})") from None
    if not d.eof or d.unused_data:
        raise PermanentJobError("the job's payload is not one complete zlib stream")
    return bytes(out)


def _over(limit: int) -> str:
    return f"the job's payload inflates past {limit:,} bytes (DECODEBENCH_MAX_JOB_MB); refused"
