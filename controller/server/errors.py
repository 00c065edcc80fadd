"""The submission server's errors: each carries the HTTP status it answers with, and is one line.

On the client side, a refused request (4xx) is a UsageError (exit 2) and a server or network
failure a ServiceError (exit 1), as everywhere else in decodebench.
"""

from __future__ import annotations

from worker.core.errors import ServiceError, UsageError


class ApiError(UsageError):
    """A request the server refuses; `status` is the HTTP status, `retry_after` seconds to wait, if any."""

    status = 400

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status or type(self).status
        self.retry_after = retry_after


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    """The token may not do this, or the tenant's policy refuses the sweep."""

    status = 403


class NotFound(ApiError):
    status = 404


class Busy(ApiError):
    """Another submit of the same tenant holds its quota lock: try again shortly."""

    status = 409


class TooLarge(ApiError):
    status = 413


class OverQuota(ApiError):
    status = 429


class RequestRefused(UsageError):
    """Client side: the server refused the request (HTTP 4xx). Exit 2."""


class ServerUnavailable(ServiceError):
    """Client side: the server failed (HTTP 5xx) or could not be reached. Exit 1."""
