"""The S3 store: `s3://bucket/prefix` on AWS or any S3-compatible service (MinIO, Ceph, …).

Same layout as the file store. Every object is written with one PUT, so a reader
sees a whole object or none; `create_only` writes use a conditional PUT
(`If-None-Match: *`), so two attempts of one job can never both write `result.json`.

Settings: DECODEBENCH_S3_ENDPOINT_URL (for non-AWS services), the standard AWS
credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or
DECODEBENCH_S3_PROFILE, instance/pod roles), AWS_REGION/AWS_DEFAULT_REGION.
Transient failures are retried by botocore (standard mode) and then by this module
with exponential backoff for up to DECODEBENCH_S3_RETRY_S seconds (default 120).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import structlog

from worker.core import settings
from worker.core.errors import MissingBucketError, StoreError, UsageError
from worker.store.base import Store

log = structlog.get_logger("decodebench.s3store")
T = TypeVar("T")

_TRANSIENT_CODES = {
    "500",
    "502",
    "503",
    "504",
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "ConditionalRequestConflict",
    "409",
    "OperationAborted",
}
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}


def _code(err: Exception) -> str:
    """The S3 error code of `err`; empty for an error without one (some carry `response = None`)."""
    return str((getattr(err, "response", None) or {}).get("Error", {}).get("Code", ""))


def is_transient(err: Exception) -> bool:
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(err, ClientError):
        status = str(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        return _code(err) in _TRANSIENT_CODES or status in _TRANSIENT_CODES
    return isinstance(err, (BotoConnectionError, HTTPClientError))


class S3Store(Store):
    read_concurrency = 16  # each read a round trip (tens of ms to S3): the report keeps this many in flight

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        client: Any = None,
        retry_s: float | None = None,
        retry_base_s: float | None = None,
    ) -> None:
        if not bucket:
            raise UsageError("s3 store: the URL needs a bucket: s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.retry_s = settings.get("s3_retry_s") if retry_s is None else retry_s
        self.retry_base_s = settings.get("s3_retry_base_s") if retry_base_s is None else retry_base_s
        self.conditional_put = settings.get("s3_conditional_put")
        self.client = client or self._make_client()

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        parts = urlsplit(url)
        if parts.scheme != "s3":
            raise UsageError(f"store {url!r}: not an s3:// URL")
        return cls(parts.netloc, parts.path, endpoint_url=settings.get("s3_endpoint_url"))

    def _make_client(self):
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(profile_name=settings.get("s3_profile"))
        config = Config(
            retries={"max_attempts": settings.get("s3_max_attempts"), "mode": "standard"},
            connect_timeout=10,
            max_pool_connections=32,  # the report's reads in flight (read_concurrency), and writes beside them
            read_timeout=60,
            s3={"addressing_style": "path" if self.endpoint_url else "auto"},
        )
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
        return session.client("s3", endpoint_url=self.endpoint_url, region_name=region, config=config)

    def _key(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"key {key!r} escapes the store prefix")
        return self.prefix + key

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        """Call fn, retrying transient failures with exponential backoff and jitter."""
        deadline = time.monotonic() + self.retry_s
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as err:
                if _code(err) == "NoSuchBucket":  # bad input, not an outage: one line, exit 2
                    at = f" at {self.endpoint_url}" if self.endpoint_url else ""
                    raise MissingBucketError(f"store {self.url}: bucket {self.bucket!r}{at} does not exist") from None
                if not is_transient(err):
                    raise
                attempt += 1
                delay = min(30.0, self.retry_base_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                if time.monotonic() + delay > deadline:
                    raise StoreError(
                        f"{self.url}: {what} failed after {attempt} attempts: {type(err).__name__}: {err}"
                    ) from None
                log.warning("s3.retry", op=what, attempt=attempt, delay_s=round(delay, 2), error=str(err)[:200])
                time.sleep(delay)

    # -- adapter interface -------------------------------------------------------------------
    def read_bytes(self, key: str, limit: int | None = None) -> bytes:
        from botocore.exceptions import ClientError

        limit = self.read_limit(limit)

        def get() -> bytes:
            reply = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            with contextlib.closing(reply["Body"]) as body:
                size = reply.get("ContentLength")
                if size is not None and size > limit:  # refused from the headers: no byte of it read
                    raise self.too_large(key, size, limit)
                data = body.read(limit + 1)
            if len(data) > limit:
                raise self.too_large(key, len(data), limit)
            return data

        try:
            return self._retry(f"read {key}", get)
        except ClientError as err:
            if _code(err) in _MISSING_CODES:
                raise StoreError(f"{self.url}/{key} does not exist") from None
            raise StoreError(f"{self.url}/{key}: {_code(err)}: {err}") from None

    def write_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> bool:
        from botocore.exceptions import ClientError

        full = self._key(key)
        if create_only and not self.conditional_put:
            if self.exists(key):  # fallback for services without conditional PUT: not atomic
                return False
            create_only = False
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full, "Body": data}
        if create_only:
            kwargs["IfNoneMatch"] = "*"
        try:
            self._retry(f"write {key}", lambda: self.client.put_object(**kwargs))
            return True
        except ClientError as err:
            code = _code(err)
            if create_only and code in ("PreconditionFailed", "412"):
                # It exists. If it holds exactly our bytes, an earlier attempt of this very call
                # succeeded (its response was lost and the retry met our own object).
                return self.read_bytes(key) == data
            if create_only and code in ("NotImplemented", "501"):
                log.warning("s3.no_conditional_put", store=self.url, note="falling back to check-then-put")
                self.conditional_put = False
                return self.write_bytes(key, data, create_only=True)
            raise StoreError(f"{self.url}/{key}: write failed: {code}: {err}") from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._retry(f"head {key}", lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key)))
            return True
        except ClientError as err:
            if _code(err) in _MISSING_CODES:
                return False
            raise StoreError(f"{self.url}/{key}: {_code(err)}: {err}") from None

    def list_versions(self, prefix: str) -> dict[str, str]:
        from botocore.exceptions import ClientError

        def pages() -> dict[str, str]:
            out = {}
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for o in page.get("Contents", []):
                    out[o["Key"][len(self.prefix) :]] = f"{o.get('ETag', '')}-{o.get('Size', '')}"
            return out

        try:
            found = self._retry(f"list {prefix}", pages)
        except ClientError as err:
            raise StoreError(f"{self.url}: list {prefix!r} failed: {_code(err)}: {err}") from None
        return {k: v for k, v in found.items() if not k.rsplit("/", 1)[-1].startswith(".")}

    def delete(self, key: str) -> None:
        self._retry(f"delete {key}", lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)))

    def check(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._retry("head bucket", lambda: self.client.head_bucket(Bucket=self.bucket))
        except (ClientError, BotoCoreError) as err:
            where = f" at {self.endpoint_url}" if self.endpoint_url else ""
            raise StoreError(f"bucket {self.bucket!r}{where}: {_code(err) or type(err).__name__}: {err}") from None
        super().check()
