"""The result store: `file://` (default `./runs`) or `s3://bucket/prefix`.

Keys are relative paths built by `worker.paths`. Writes are atomic: a reader sees a
whole object or none. `result.json` is written last and marks a job complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from worker import paths
from worker.contract import GenerationRecord, JobResult
from worker.errors import StoreError, UsageError

DEFAULT_STORE = "./runs"
_UMASK = os.umask(0)
os.umask(_UMASK)


def jsonl_bytes(rows: Iterable[dict]) -> bytes:
    """One JSON object per line, keys sorted: the bytes of a .jsonl object."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


class Store:
    """Byte-level operations are the adapter's; JSON and job helpers are shared."""

    url: str

    # -- adapter interface -------------------------------------------------------------
    def read_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    def write_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> bool:
        """Write atomically. With `create_only`, do nothing and return False if it exists."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix`, sorted."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Raise StoreError unless the store is reachable and writable (for `doctor`)."""
        probe = "_doctor/probe"
        self.write_bytes(probe, b"ok")
        if self.read_bytes(probe) != b"ok":
            raise StoreError(f"store {self.url}: read back differs from what was written")
        self.delete(probe)

    # -- shared helpers ----------------------------------------------------------------
    def read_json(self, key: str) -> Any:
        return json.loads(self.read_bytes(key))

    def write_json(self, key: str, obj: Any, *, create_only: bool = False) -> bool:
        data = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
        return self.write_bytes(key, data, create_only=create_only)

    def read_jsonl(self, key: str) -> Iterator[dict]:
        for line in self.read_bytes(key).decode().splitlines():
            if line.strip():
                yield json.loads(line)

    def write_jsonl(self, key: str, rows: Iterable[dict]) -> None:
        self.write_bytes(key, jsonl_bytes(rows))

    # -- job-level helpers -------------------------------------------------------------
    def job_complete(self, tenant: str, sweep_id: str, job_id: str) -> bool:
        return self.exists(paths.result_key(tenant, sweep_id, job_id))

    def complete_job_ids(self, tenant: str, sweep_id: str) -> set[str]:
        prefix = paths.jobs_prefix(tenant, sweep_id)
        return {k[len(prefix):].split("/")[0] for k in self.list(prefix) if k.endswith("/result.json")}

    def load_result(self, tenant: str, sweep_id: str, job_id: str) -> JobResult:
        return JobResult.model_validate(self.read_json(paths.result_key(tenant, sweep_id, job_id)))

    def load_generations(self, tenant: str, sweep_id: str, job_id: str, sha256: str | None = None) -> list[GenerationRecord]:
        """A job's generations; with `sha256` (from its result.json), checked against it."""
        data = self.read_bytes(paths.generations_key(tenant, sweep_id, job_id))
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise StoreError(f"job {job_id}: generations.jsonl does not match its result.json (written by another run "
                             f"of the job?); delete the job's result.json and run or retry the sweep")
        return [GenerationRecord.model_validate_json(line) for line in data.decode().splitlines() if line.strip()]

    def load_spec(self, tenant: str, sweep_id: str) -> dict:
        key = paths.spec_key(tenant, sweep_id)
        if not self.exists(key):
            raise UsageError(f"no sweep {sweep_id!r} for tenant {tenant!r} in {self.url}")
        return self.read_json(key)

    def list_sweeps(self, tenant: str) -> list[str]:
        prefix = paths.sweeps_prefix(tenant)
        return sorted({k[len(prefix):].split("/")[0] for k in self.list(prefix) if k.endswith("/spec.json")})


class FileStore(Store):
    """A directory tree; atomic writes by temp file + rename."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root not in p.parents and p != self.root:
            raise StoreError(f"key {key!r} escapes the store root")
        return p

    def read_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"{self.url}/{key} does not exist") from None

    def write_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> bool:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are as readable as any file
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if create_only:
                try:
                    os.link(tmp, target)  # fails if target exists: create-only, atomic
                except FileExistsError:
                    return False
                return True
            os.replace(tmp, target)
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.exists():
            return []
        out = []
        for p in base.rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                rel = p.relative_to(self.root).as_posix()
                if rel.startswith(prefix):
                    out.append(rel)
        return sorted(out)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


def open_store(url: str | None = None) -> Store:
    """`s3://bucket/prefix`, `file:///abs/path` or a plain path; default from DECODEBENCH_STORE or ./runs."""
    url = url or os.environ.get("DECODEBENCH_STORE") or DEFAULT_STORE
    if url.startswith("s3://"):
        from worker.s3store import S3Store  # boto3 only where used

        return S3Store.from_url(url)
    if url.startswith("file://"):
        return FileStore(url[len("file://"):])
    if "://" in url:
        raise UsageError(f"store {url!r}: unsupported scheme (use a path, file:// or s3://)")
    return FileStore(url)
