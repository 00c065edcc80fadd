"""The result store: `file://` (default `./runs`) or `s3://bucket/prefix`, one layout for both.

`open_store(url)` picks the adapter; `Store` is the interface every part uses.
"""

from __future__ import annotations

from worker.core import settings
from worker.core.errors import UsageError, quote
from worker.store.base import Store, jsonl_bytes
from worker.store.file import FileStore

__all__ = ["FileStore", "Store", "jsonl_bytes", "open_store"]


def open_store(url: str | None = None) -> Store:
    """`s3://bucket/prefix`, `file:///abs/path` or a plain path; default from DECODEBENCH_STORE or ./runs."""
    url = url or settings.get("store")
    check_length(url)
    if url.startswith("s3://"):
        from worker.store.s3 import S3Store  # boto3 only where used

        return S3Store.from_url(url)
    if url.startswith("file://"):
        return FileStore(url[len("file://") :])
    if "://" in url:
        raise UsageError(f"store {url!r}: unsupported scheme (use a path, file:// or s3://)")
    return FileStore(url)


# Room left for the layout under the root (<tenant>/sweeps/<id>/jobs/<id>/generations.jsonl and
# the rating sheets): a root longer than this would fail later, as an OSError of the file
# system or an S3 error, on the first write.
_LAYOUT_BYTES = 240
_MAX_BYTES = {"s3": 1024 - _LAYOUT_BYTES, "file": 4096 - _LAYOUT_BYTES}
_MAX_SEGMENT = 255  # a file name (NAME_MAX); S3 has no such limit but no one needs more


def check_length(url: str) -> None:
    """A store URL or path too long to hold the store's layout: one line (UsageError, exit 2)."""
    scheme = "s3" if url.startswith("s3://") else "file"
    size = len(url.encode("utf-8", "surrogateescape"))
    longest = max((len(p.encode("utf-8", "surrogateescape")) for p in url.split("/")), default=0)
    if size > _MAX_BYTES[scheme] or longest > _MAX_SEGMENT:
        raise UsageError(
            f"store {quote(url, 60)}: too long ({size:,} bytes, a name of {longest:,}); at most "
            f"{_MAX_BYTES[scheme]:,} bytes with names of at most {_MAX_SEGMENT}"
        )
