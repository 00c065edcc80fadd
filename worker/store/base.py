"""The store interface: byte-level operations are each adapter's, JSON and job helpers shared.

Keys are relative paths built by `worker.core.paths`. Writes are atomic: a reader sees a
whole object or none. `result.json` is written last and marks a job complete.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from worker.core import paths
from worker.core.contract import GenerationRecord, JobResult
from worker.core.errors import StoreError, UsageError


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
        return {k[len(prefix) :].split("/")[0] for k in self.list(prefix) if k.endswith("/result.json")}

    def load_result(self, tenant: str, sweep_id: str, job_id: str) -> JobResult:
        return JobResult.model_validate(self.read_json(paths.result_key(tenant, sweep_id, job_id)))

    def load_generations(
        self, tenant: str, sweep_id: str, job_id: str, sha256: str | None = None
    ) -> list[GenerationRecord]:
        """A job's generations; with `sha256` (from its result.json), checked against it."""
        data = self.read_bytes(paths.generations_key(tenant, sweep_id, job_id))
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise StoreError(
                f"job {job_id}: generations.jsonl does not match its result.json (written by another run "
                f"of the job?); delete the job's result.json and run or retry the sweep"
            )
        return [GenerationRecord.model_validate_json(line) for line in data.decode().splitlines() if line.strip()]

    def load_spec(self, tenant: str, sweep_id: str) -> dict:
        key = paths.spec_key(tenant, sweep_id)
        if not self.exists(key):
            raise UsageError(f"no sweep {sweep_id!r} for tenant {tenant!r} in {self.url}")
        return self.read_json(key)

    def list_sweeps(self, tenant: str) -> list[str]:
        prefix = paths.sweeps_prefix(tenant)
        return sorted({k[len(prefix) :].split("/")[0] for k in self.list(prefix) if k.endswith("/spec.json")})

    def resolve_sweep(self, tenant: str, sweep: str) -> str:
        """A sweep id or a unique prefix of one."""
        if self.exists(paths.spec_key(tenant, sweep)):
            return sweep
        matches = [s for s in self.list_sweeps(tenant) if s.startswith(sweep)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UsageError(f"sweep prefix {sweep!r} is ambiguous: {', '.join(matches[:5])}")
        raise UsageError(f"no sweep {sweep!r} for tenant {tenant!r} in {self.url}")
