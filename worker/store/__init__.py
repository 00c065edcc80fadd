"""The result store: `file://` (default `./runs`) or `s3://bucket/prefix`, one layout for both.

`open_store(url)` picks the adapter; `Store` is the interface every part uses.
"""

from __future__ import annotations

from worker.core import settings
from worker.core.errors import UsageError
from worker.store.base import Store, jsonl_bytes
from worker.store.file import FileStore

__all__ = ["FileStore", "Store", "jsonl_bytes", "open_store"]


def open_store(url: str | None = None) -> Store:
    """`s3://bucket/prefix`, `file:///abs/path` or a plain path; default from DECODEBENCH_STORE or ./runs."""
    url = url or settings.get("store")
    if url.startswith("s3://"):
        from worker.store.s3 import S3Store  # boto3 only where used

        return S3Store.from_url(url)
    if url.startswith("file://"):
        return FileStore(url[len("file://") :])
    if "://" in url:
        raise UsageError(f"store {url!r}: unsupported scheme (use a path, file:// or s3://)")
    return FileStore(url)
