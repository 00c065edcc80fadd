"""Redis connections and URL redaction: the one place decodebench opens Redis.

- `connect(url)`: a client checked with PING; ServiceError (one line, no password) if
  Redis is unreachable. The controller's commands use it.
- `connect_patiently(url)`: a client that rides out a Redis restart (connection errors
  retried with jittered exponential backoff); the worker uses it.
- `redact_url(url)`: the URL without its password, fit for a log line or a message.

With DECODEBENCH_REDIS_PASSWORD_FILE set, the password comes from that file (the chart mounts
a Secret there), not from the URL: it replaces any password in the URL, the URL's user stays
(`redis://worker@redis:6379/0` logs in as `worker`), and the file is read again on every new
connection, so a rotated Secret is picked up when the client reconnects.

A `rediss://` URL (an external managed Redis over TLS) always verifies the server's certificate and
host name, against DECODEBENCH_REDIS_CA_FILE when it is set, else the system's CAs.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from worker.core.errors import ServiceError, UsageError


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
    """The ACL user named in a Redis URL (`redis://team-a:<password>@host`, or `redis://team-a@host`
    with DECODEBENCH_REDIS_PASSWORD_FILE), None if none."""
    from worker.core import settings

    try:
        parts = urlsplit(url)
        has_password = parts.password is not None or bool(settings.get("redis_password_file"))
        return unquote(parts.username) if parts.username and has_password else None
    except ValueError:
        return None


def read_password_file(path: str) -> str:
    """The password in `path` (one trailing newline dropped); UsageError naming the file, never its content."""
    try:
        return Path(path).read_text().removesuffix("\n").removesuffix("\r")
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or "not text"
        raise UsageError(f"DECODEBENCH_REDIS_PASSWORD_FILE={path}: cannot read the Redis password: {why}") from None


def _open(url: str, **kwargs):
    """redis.Redis.from_url, with the password from DECODEBENCH_REDIS_PASSWORD_FILE when it is set."""
    import redis
    from redis.credentials import CredentialProvider

    from worker.core import settings

    if url.startswith("rediss://"):  # TLS: the certificate and its host name always verified
        kwargs |= {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
        if ca := settings.get("redis_ca_file"):
            kwargs["ssl_ca_certs"] = ca
    path = settings.get("redis_password_file")
    if not path:
        return redis.Redis.from_url(url, **kwargs)
    read_password_file(path)  # fail now, in one line, if it cannot be read
    parts = urlsplit(url)
    user = unquote(parts.username) if parts.username else None

    class FromFile(CredentialProvider):
        def get_credentials(self):
            password = read_password_file(path)
            return (user, password) if user else (password,)

    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 address
        netloc = f"[{netloc}]"
    netloc += f":{parts.port}" if parts.port else ""
    bare = urlunsplit(parts._replace(netloc=netloc))  # no user, no password: the provider gives both
    return redis.Redis.from_url(bare, credential_provider=FromFile(), **kwargs)


def open_redis(url: str, **kwargs):
    """An unchecked client for `url` (kwargs as redis.Redis.from_url), password file applied."""
    return _open(url, **kwargs)


def connect(url: str, *, timeout_s: float = 5.0):
    """A Redis client for `url`, checked with PING; ServiceError if unreachable."""
    import redis

    try:
        conn = _open(url, socket_connect_timeout=timeout_s, health_check_interval=30)
        conn.ping()
    except (redis.RedisError, OSError, ValueError) as err:
        raise ServiceError(f"Redis at {redact_url(url)} is not reachable: {err}") from None
    return conn


def connect_patiently(url: str):
    """A Redis client whose connection errors are retried with jittered exponential backoff
    (0.5 s doubling, capped at 10 s, 12 times: about a minute), for long-lived workers."""
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.retry import Retry

    return _open(url, health_check_interval=30, retry=Retry(ExponentialWithJitterBackoff(cap=10, base=0.5), 12))
