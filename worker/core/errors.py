"""Errors of the data plane. A user-facing error prints one line and exits non-zero."""

from __future__ import annotations


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


class StoreError(ServiceError):
    """The store failed to read or write an object."""
