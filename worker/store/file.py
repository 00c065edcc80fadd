"""The file store: a directory tree (default `./runs`); atomic writes by temp file + rename."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from worker.core.errors import StoreError
from worker.store.base import Store

_UMASK = os.umask(0)
os.umask(_UMASK)


class FileStore(Store):
    """A directory tree; atomic writes by temp file + rename."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser().resolve()
        self._root = str(self.root)
        self._base = os.path.join(self._root, "")  # the root with one trailing separator ("/" stays "/")
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        """The file of `key`, which must stay inside its tenant's directory (`<root>/<tenant>/`,
        its first segment) once resolved: no `..`, no absolute key, no symlink out of it."""
        parts = key.split("/")
        if key.startswith("/") or "\\" in key or any(part in ("..", ".") for part in parts):
            raise StoreError(f"key {key!r} escapes the store root")
        p = os.path.realpath(os.path.join(self._root, key))  # symlinks followed, as the open will
        if p != self._root and not p.startswith(self._base):
            raise StoreError(f"key {key!r} escapes the store root")
        tenant_root = self._base + parts[0]
        if p not in (self._root, tenant_root) and not p.startswith(tenant_root + os.sep):
            raise StoreError(f"key {key!r} escapes the directory of tenant {parts[0]!r}")
        return Path(p)

    def read_bytes(self, key: str, limit: int | None = None) -> bytes:
        limit = self.read_limit(limit)
        try:  # non-blocking: a FIFO planted under the key is refused, never waited on
            fd = os.open(self._path(key), os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise StoreError(f"{self.url}/{key} does not exist") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"{self.url}/{key} is not a regular file")
            if st.st_size > limit:
                raise self.too_large(key, st.st_size, limit)
            data = f.read(limit + 1)  # the file may have grown since
        if len(data) > limit:
            raise self.too_large(key, len(data), limit)
        return data

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
        return sorted(rel for rel, _ in self._under(prefix))

    def list_versions(self, prefix: str) -> dict[str, str]:
        out = {}
        for rel, entry in self._under(prefix):
            st = entry.stat()  # a write renames a new file over the key: a new inode and mtime (mtime may be coarse)
            out[rel] = f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"
        return out

    def _under(self, prefix: str) -> Iterator[tuple[str, os.DirEntry | Path]]:
        """(key, its directory entry) of each file whose key starts with `prefix`, under the directory
        it names or the one file a whole key names; names starting with "." (a write's temporary file)
        left out; a symlinked directory is not entered (reading through it is refused anyway, `_path`)."""
        top = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        start = len(self._base)
        if top.is_file():
            rel = str(top)[start:].replace(os.sep, "/")
            if not top.name.startswith(".") and rel.startswith(prefix):
                yield rel, top
            return
        stack = [str(top)]
        while stack:
            try:
                entries = list(os.scandir(stack.pop()))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif not entry.name.startswith(".") and entry.is_file():
                    rel = entry.path[start:].replace(os.sep, "/")
                    if rel.startswith(prefix):
                        yield rel, entry

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
