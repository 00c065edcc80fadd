"""Redis connections and URL redaction: the one place decodebench opens Redis.

- `connect(url)`: a client checked with PING; ServiceError (one line, no password) if
  Redis is unreachable. The controller's commands use it.
- `connect_patiently(url)`: a client that rides out a Redis restart (connection errors
  retried with jittered exponential backoff); the worker uses it.
- `redact_url(url)`: the URL without its password, fit for a log line or a message.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from worker.core.errors import ServiceError


def redact_url(url: str) -> str:
    """The Redis URL without its password (never log a secret)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed URL: keep only its scheme
        return url.partition("://")[0] + "://***"
    if password:
        user = f"{parts.username}:***" if parts.username else "***"
        netloc = f"{user}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def redis_user(url: str) -> str | None:
    """The ACL user named in a Redis URL (`redis://team-a:<password>@host`), None if none."""
    try:
        parts = urlsplit(url)
        return parts.username if parts.username and parts.password is not None else None
    except ValueError:
        return None


def connect(url: str, *, timeout_s: float = 5.0):
    """A Redis client for `url`, checked with PING; ServiceError if unreachable."""
    import redis

    try:
        conn = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, health_check_interval=30)
        conn.ping()
    except (redis.RedisError, OSError, ValueError) as err:
        raise ServiceError(f"Redis at {redact_url(url)} is not reachable: {err}") from None
    return conn


def connect_patiently(url: str):
    """A Redis client whose connection errors are retried with jittered exponential backoff
    (0.5 s doubling, capped at 10 s, 12 times: about a minute), for long-lived workers."""
    import redis
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url, health_check_interval=30, retry=Retry(ExponentialWithJitterBackoff(cap=10, base=0.5), 12)
    )
