"""The store interface: byte-level operations are each adapter's, JSON and job helpers shared.

Keys are relative paths built by `worker.core.paths`. Writes are atomic: a reader sees a
whole object or none. `result.json` is written last and marks a job complete.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from worker.core import paths, settings
from worker.core.errors import CorruptRecordError, RecordTooLargeError, StoreError, UsageError, shown
from worker.core.results import GenerationRecord, JobResult


def _reason(err: ValueError) -> str:
    """One line on why a stored record does not parse (ValidationError, JSON or UTF-8 errors)."""
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return f"not a valid record ({loc or 'record'}: {first['msg']})"
    if isinstance(err, json.JSONDecodeError):
        return f"truncated or not JSON ({err.msg} at line {err.lineno}, column {err.colno})"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 (byte {err.start})"
    return shown(str(err), 120)


def jsonl_bytes(rows: Iterable[dict]) -> bytes:
    """One JSON object per line, keys sorted: the bytes of a .jsonl object."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


class Store:
    """Byte-level operations are the adapter's; JSON and job helpers are shared."""

    url: str
    # reads worth having in flight at once (controller.report.load.jobs.read_each): 1 for a local disk, where a
    # read costs CPU that threads only share; more where each read is a network round trip (S3)
    read_concurrency: int = 1

    # -- adapter interface -------------------------------------------------------------
    def read_bytes(self, key: str, limit: int | None = None) -> bytes:
        """The object's bytes; a RecordTooLargeError, before reading it, where it holds more than `limit`
        bytes (default DECODEBENCH_STORE_MAX_READ_MB: a tenant's planted object costs a reader that much
        at most)."""
        raise NotImplementedError

    def write_bytes(self, key: str, data: bytes, *, create_only: bool = False) -> bool:
        """Write atomically. With `create_only`, do nothing and return False if it exists."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix`, sorted."""
        return sorted(self.list_versions(prefix))

    def list_versions(self, prefix: str) -> dict[str, str]:
        """Keys under `prefix`, each with a tag that changes when the object is written again with other
        bytes (S3: its ETag and size; a file: its inode, mtime and size); one listing, no object read."""
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
    @staticmethod
    def read_limit(limit: int | None) -> int:
        """Bytes a read may return: `limit`, else DECODEBENCH_STORE_MAX_READ_MB."""
        return int(settings.get("store_max_read_mb") * 2**20) if limit is None else limit

    def too_large(self, key: str, size: int, limit: int) -> RecordTooLargeError:
        where = f"{self.url.rstrip('/')}/{key}"
        return RecordTooLargeError(f"{where}: {size:,} bytes or more, over the read limit of {limit:,} bytes; not read")

    def damaged(self, key: str, reason: str) -> CorruptRecordError:
        return CorruptRecordError(f"{self.url.rstrip('/')}/{key}: {reason}")

    def read_json(self, key: str, limit: int | None = None) -> Any:
        """The JSON object at `key`; a CorruptRecordError naming it if it does not parse."""
        return self.parse_json(key, self.read_bytes(key, limit))

    def parse_json(self, key: str, data: bytes) -> Any:
        """`data`, read from `key`, as JSON; a CorruptRecordError naming it if it does not parse."""
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError; absurd nesting
            raise self.damaged(key, _reason(err) if isinstance(err, ValueError) else "nested too deeply") from None

    def write_json(self, key: str, obj: Any, *, create_only: bool = False) -> bool:
        data = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
        return self.write_bytes(key, data, create_only=create_only)

    def _jsonl_lines(self, key: str, data: bytes) -> Iterator[tuple[int, str]]:
        try:
            text = data.decode()
        except UnicodeDecodeError as err:
            raise self.damaged(key, _reason(err)) from None
        for n, line in enumerate(text.split("\n"), 1):  # "\n" only: U+2028 may sit in a string
            if line.strip():
                yield n, line

    def read_jsonl(self, key: str, limit: int | None = None) -> Iterator[dict]:
        for n, line in self._jsonl_lines(key, self.read_bytes(key, limit)):
            try:
                yield json.loads(line)
            except ValueError as err:
                raise self.damaged(key, f"line {n}: {_reason(err)}") from None

    def write_jsonl(self, key: str, rows: Iterable[dict]) -> None:
        self.write_bytes(key, jsonl_bytes(rows))

    # -- job-level helpers -------------------------------------------------------------
    def job_complete(self, tenant: str, sweep_id: str, job_id: str) -> bool:
        return self.exists(paths.result_key(tenant, sweep_id, job_id))

    def complete_job_ids(self, tenant: str, sweep_id: str, listed: Iterable[str] | None = None) -> set[str]:
        """The ids of the jobs with a result.json; `listed`: the keys under the sweep's jobs prefix, where
        the caller has listed them already (controller.report.distribute.plancache), else listed here."""
        prefix = paths.jobs_prefix(tenant, sweep_id)
        keys = self.list(prefix) if listed is None else listed
        return {k[len(prefix) :].split("/")[0] for k in keys if k.startswith(prefix) and k.endswith("/result.json")}

    def load_result(self, tenant: str, sweep_id: str, job_id: str) -> JobResult:
        """A job's result.json; CorruptRecordError if it is truncated or not a JobResult."""
        return self.load_result_bytes(tenant, sweep_id, job_id)[0]

    def load_result_bytes(self, tenant: str, sweep_id: str, job_id: str) -> tuple[JobResult, bytes]:
        """A job's result.json, and its bytes as read (controller.report.load.snapshot keeps them);
        CorruptRecordError if it is truncated or not a JobResult."""
        key = paths.result_key(tenant, sweep_id, job_id)
        data = self.read_bytes(key)
        try:
            return JobResult.model_validate(self.parse_json(key, data)), data
        except ValidationError as err:
            raise self.damaged(key, _reason(err)) from None

    def load_generations(
        self, tenant: str, sweep_id: str, job_id: str, sha256: str | None = None
    ) -> list[GenerationRecord]:
        """A job's generations; with `sha256` (from its result.json), checked against it.

        A file that does not match or does not parse is a CorruptRecordError naming it."""
        key = paths.generations_key(tenant, sweep_id, job_id)
        data = self.read_bytes(key)
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise self.damaged(
                key,
                f"job {job_id}: generations.jsonl does not match its result.json (truncated, or written by "
                "another run of the job?); delete the job's result.json and run or retry the sweep",
            )
        records = []
        for n, line in self._jsonl_lines(key, data):
            try:
                records.append(GenerationRecord.model_validate_json(line))
            except ValidationError as err:
                raise self.damaged(key, f"line {n}: {_reason(err)}") from None
        return records

    def load_spec(self, tenant: str, sweep_id: str) -> dict:
        """spec.json: the sweep's spec under "spec", with its metadata (or the spec alone); a CorruptRecordError
        naming the file if it does not parse or the spec and the parts a report reads
        (models, strategies, generation and its seeds) are not of their JSON types."""
        key = paths.spec_key(tenant, sweep_id)
        if not self.exists(key):
            raise UsageError(f"no sweep {sweep_id!r} for tenant {tenant!r} in {self.url}")
        stored = self.read_json(key)
        inner = stored.get("spec", stored) if isinstance(stored, dict) else None  # or the spec alone
        if not isinstance(inner, dict):
            raise self.damaged(key, "not a stored sweep spec (a JSON object)")
        generation = inner.get("generation", {})
        shapes = {"models": (inner.get("models", []), list), "strategies": (inner.get("strategies", []), list)}
        shapes["generation"] = (generation, dict)
        shapes["generation.seeds"] = (generation.get("seeds", []) if isinstance(generation, dict) else [], list)
        for where, (value, kind) in shapes.items():
            if not isinstance(value, kind):
                raise self.damaged(key, f"spec.{where} is not a JSON {'array' if kind is list else 'object'}")
        return stored

    def load_plan(self, tenant: str, sweep_id: str) -> list[dict] | None:
        """plan.json's jobs (each an object with a string "cell"), None if the sweep has none;
        a CorruptRecordError naming the file if it does not parse or is not of that shape."""
        key = paths.plan_key(tenant, sweep_id)
        if not self.exists(key):
            return None
        plan = self.read_json(key)
        jobs = plan.get("jobs") if isinstance(plan, dict) else plan
        if not isinstance(jobs, list):
            raise self.damaged(key, 'not a plan (an object with a "jobs" array)')
        for n, job in enumerate(jobs):
            if not isinstance(job, dict) or not isinstance(job.get("cell"), str):
                raise self.damaged(key, f'jobs[{n}] is not an object with a string "cell"')
        return jobs

    def list_sweeps(self, tenant: str) -> list[str]:
        prefix = paths.sweeps_prefix(tenant)
        return sorted({k[len(prefix) :].split("/")[0] for k in self.list(prefix) if k.endswith("/spec.json")})

    def job_sweep(self, tenant: str, job_id: str) -> str | None:
        """The tenant's sweep in this store that holds a log of `job_id` (None: none does)."""
        return next((s for s in self.list_sweeps(tenant) if self.exists(paths.log_key(tenant, s, job_id))), None)

    def resolve_sweep(self, tenant: str, sweep: str) -> str:
        """A sweep id or a unique prefix of one."""
        paths.check_id("sweep", sweep)
        if self.exists(paths.spec_key(tenant, sweep)):
            return sweep
        matches = [s for s in self.list_sweeps(tenant) if s.startswith(sweep)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UsageError(f"sweep prefix {sweep!r} is ambiguous: {', '.join(matches[:5])}")
        from worker.store.nearby import elsewhere

        here = Path(self.url[len("file://") :]) if self.url.startswith("file://") else None
        raise UsageError(f"no sweep {sweep!r} for tenant {tenant!r} in {self.url}{elsewhere(tenant, sweep, here)}")
