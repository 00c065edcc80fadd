"""Errors of the data plane. A user-facing error prints one line and exits non-zero."""

from __future__ import annotations

import reprlib


class DecodebenchError(Exception):
    """Base class: `str(err)` is the one line shown to the user."""

    exit_code = 1


class UsageError(DecodebenchError):
    """Bad input or bad usage (a spec, a flag, a device that does not exist)."""

    exit_code = 2


class ServiceError(DecodebenchError):
    """A service (Redis, the store, the Kubernetes API) is unreachable or refused."""

    exit_code = 1


class PermanentJobError(DecodebenchError):
    """A job that cannot succeed on retry (model not found, invalid parameters)."""

    exit_code = 1


class ModelUnavailableError(PermanentJobError):
    """A model (or its tokenizer) that cannot load: every job that needs it would fail the same way.

    `model` is its path or hub id, so that a sweep runner can skip the model's other jobs."""

    def __init__(self, message: str, model: str | None = None) -> None:
        super().__init__(message)
        self.model = model


class StoreError(ServiceError):
    """The store failed to read or write an object."""


class MissingBucketError(UsageError, StoreError):
    """The store's S3 bucket does not exist: a wrong setting, not an outage (exit 2, HTTP 400)."""


class CorruptRecordError(StoreError):
    """A stored record that cannot be read back (truncated, not JSON, not the contract's shape)."""


class RecordTooLargeError(CorruptRecordError):
    """A stored object larger than its reader allows, refused before it is read (a planted file
    costs a reader no more than the limit)."""


class Interrupted(BaseException):
    """Raised inside a running job by its worker (not by the job): shutdown or cancel.

    A BaseException so that no `except Exception` in the job swallows it.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why  # "shutdown": requeue the job; "cancel": the sweep was cancelled


_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlong = 40
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxdict = 4


def short(value: object, limit: int = 80) -> str:
    """`repr(value)` escaped and cut to about `limit` characters, at bounded cost, for messages.

    A value built from YAML aliases can expand to millions of items and a key can hold
    newlines; either still gives one readable line.
    """
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(text: str, limit: int = 200) -> str:
    """A file name or key as it is if it is printable and short, else `quote(text, limit)`."""
    return text if text.isprintable() and len(text) <= limit else quote(text, limit)


def quote(text: str, limit: int = 200) -> str:
    """`repr(text)`, cut to about `limit` characters (escapes counted): a path or a name in a message."""
    r = repr(text[:limit])
    return r if len(text) <= limit and len(r) <= limit + 2 else r[:limit] + "..."
