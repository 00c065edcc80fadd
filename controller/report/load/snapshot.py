"""A sweep's results kept in one object beside its report, so that a load reads only what changed.

The report's plan (`load_sweep` without the generations: on the controller, and on the submission
server for `report --distributed`) reads every complete job's result.json: 190k GETs for a team
sweep, minutes from S3, and all of them again for each report while the sweep grows or after a
retry. `report/cache/results.jsonl.gz` keeps each result as it was last read, with the store's version tag
of its result.json then (an S3 ETag and size; a file's inode, mtime and size: `Store.list_versions`).
A load lists the jobs with their tags (the listing it needs anyway: a round trip per 1,000 keys),
takes from the snapshot each result whose tag is the one listed now, reads only the others (new,
retried, rewritten) from the store, and writes the snapshot afresh when it read any.

What it trusts. An entry is used only under the tag the store lists for its result.json now, so a
stale entry is never used. The snapshot lies in the tenant's own prefix and is written by whoever
loads (the tenant's `decodebench report`, the submission server), as the results themselves are
written by whoever holds the tenant's store: a writer able to plant an entry can rewrite the
result.json too, and a report worker re-reads every result of its cell from its own store and checks
it against what it was asked for (remote.checked_units). Each entry is validated as a JobResult of
its own job id, else that result is read from the store. A damaged, foreign or out-of-order snapshot
is used up to the damage and replaced; a line is read at most MAX_LINE bytes at a time.

Format: gzip of a header line `{"v": 1, "tenant": ..., "sweep_id": ...}`, then per job, in job-id
order, a head line `{"job": id, "tag": tag, "size": n}` and the n bytes of its result.json as read
(no re-encoding: a cold load only compresses what it read), then a newline. The first pass over it
reads the heads only.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import structlog

from controller.report.load.jobs import job_reader, read_each
from worker.core import paths, settings
from worker.core.errors import CorruptRecordError, StoreError
from worker.core.results import JobResult

NAME = "results.jsonl.gz"  # in the report cache: deleting report/cache/ stays safe
VERSION = 1
MAX_LINE = 16 * 2**20  # bytes of one entry: far above any result.json, and what one bad line can cost
SLACK = 1024  # entries read beyond the sweep's complete jobs (those of jobs since deleted)


def key_of(tenant: str, sweep_id: str) -> str:
    return paths.report_key(tenant, sweep_id, f"cache/{NAME}")


def _head(line: bytes) -> Any:
    """The JSON of a head line, or None."""
    if not line.endswith(b"\n"):  # cut at MAX_LINE, or the file ends mid-line
        return None
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def inflation_limit() -> int:
    """Bytes a load inflates from the snapshot at most per pass (DECODEBENCH_REPORT_SNAPSHOT_MAX_MB)."""
    return int(settings.get("report_snapshot_max_mb") * 2**20)


def _entries(
    data: bytes | None, header: dict, bodies: bool, limit: int
) -> Iterator[tuple[str, str, bytes, bytes | None]]:
    """(job id, tag, head line, its result.json's bytes or None) of each entry in the file's order, up
    to the first that is not one: the damage of a truncated or hand-edited file, another sweep's or
    version's header, ids not increasing, a size out of bounds; at most `limit` entries (a planted
    file of millions of tiny entries costs no more than the sweep's own) and `inflation_limit()` bytes
    inflated (a planted file of highly compressible entries costs no more than that: the entries past
    it are read from the store). `bodies=False` skips the bytes."""
    if not data:
        return
    last, budget = "", inflation_limit()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            if _head(f.readline(MAX_LINE)) != header:
                return
            while limit > 0 and (line := f.readline(MAX_LINE)):
                limit -= 1
                head = _head(line)
                job, tag, size = (head.get(k) for k in ("job", "tag", "size")) if isinstance(head, dict) else [None] * 3
                if not (isinstance(job, str) and isinstance(tag, str) and job > last):
                    return
                if type(size) is not int or not 0 < size <= MAX_LINE:
                    return
                budget -= len(line) + size + 1
                if budget < 0:
                    return
                body = f.read(size) if bodies else None
                if body is None:
                    f.seek(size, 1)  # decompressed and dropped; at the end of a truncated file, stops there
                if (body is not None and len(body) != size) or f.read(1) != b"\n":
                    return
                last = job
                yield job, tag, line, body
    except (OSError, EOFError, zlib.error):  # gzip.BadGzipFile is an OSError
        return


def _result(body: bytes, job_id: str) -> JobResult | None:
    """The entry's result if it is a JobResult of this job, else None (read it from the store)."""
    try:
        result = JobResult.model_validate_json(body)
    except ValueError:  # pydantic's ValidationError is a ValueError
        return None
    return result if result.job.job_id == job_id else None


def _entry(job_id: str, tag: str, body: bytes) -> bytes:
    head = json.dumps({"job": job_id, "tag": tag, "size": len(body)}, separators=(",", ":"))
    return head.encode() + b"\n" + body + b"\n"


def load_results(
    store, tenant: str, sweep_id: str, job_ids: list[str], tags: Mapping[str, str]
) -> Iterator[tuple[str, JobResult | CorruptRecordError]]:
    """(job id, its result or the CorruptRecordError naming what is damaged), in the order of `job_ids`
    (sorted); `tags`: the version tags the store lists for the sweep's keys now. From the snapshot where
    its tag is the listed one, else read from the store (`read_concurrency` at a time); the snapshot is
    rewritten once every result has been taken (the caller takes the iterator to its end), where the
    load read any from the store. A load that takes every result from the snapshot writes nothing (re-
    compressing them cost a warm load a third of its time); where one of them turns out damaged, the
    snapshot is rebuilt at the end from its own entries and what was read in their place."""
    key, header = key_of(tenant, sweep_id), {"v": VERSION, "tenant": tenant, "sweep_id": sweep_id}
    try:
        data = store.read_bytes(key, inflation_limit())  # compressed: never more than it inflates to
    except StoreError:  # none yet (or unreadable: then every result is read, and the snapshot rewritten)
        data = None
    listed = {j: tags.get(paths.result_key(tenant, sweep_id, j)) for j in job_ids}
    limit = len(job_ids) + SLACK
    hits, n_old = set(), 0
    for job, tag, _, _ in _entries(data, header, bodies=False, limit=limit):
        n_old += 1
        if listed.get(job) == tag:
            hits.add(job)
    read = lambda job_id: _read(store, tenant, sweep_id, job_id)
    fetched = read_each(read, [j for j in job_ids if j not in hits], store.read_concurrency)
    kept = ((job, line, body) for job, _, line, body in _entries(data, header, True, limit) if job in hits)
    out, buffer = _writer(header) if (len(hits) != n_old or len(hits) != len(job_ids)) else (None, None)
    mended: dict[str, bytes] = {}  # a warm load's entries that were not what their heads said: what replaces them
    for job_id in job_ids:
        if job_id in hits:
            _, line, body = next(kept)
            result = _result(body, job_id)
            if result is not None:
                if out is not None:
                    out.write(line + body + b"\n")
                yield job_id, result
                continue
            loaded = read(job_id)  # not what its head says: read from the store
        else:
            loaded = next(fetched)
        entry = b""  # a result still damaged in the store has none
        if not isinstance(loaded, CorruptRecordError):
            result, body = loaded
            entry, loaded = _entry(job_id, listed[job_id] or "", body), result
        if out is not None:
            out.write(entry)
        else:
            mended[job_id] = entry
        yield job_id, loaded
    if out is None and mended:  # every entry was a hit, and some were damaged: rebuilt from the others
        out, buffer = _writer(header)
        for job, _, line, body in _entries(data, header, True, limit):
            out.write(mended.get(job, line + body + b"\n"))
    if out is not None:
        out.close()
        _save(store, key, buffer.getvalue())


def complete_jobs(store, tenant: str, sweep_id: str, with_generations: bool, versions: Mapping[str, str] | None):
    """load_sweep's jobs: the complete jobs' ids, sorted, and an iterator over (job id, its (result, its
    generations or []) or the CorruptRecordError naming what is damaged), to be taken to its end. With
    the generations, each job is read from the store; without, its result comes from the snapshot where
    unchanged. `versions`: the version tags of the sweep's keys where the caller has listed them
    (plancache), else listed here."""
    if with_generations:
        job_ids = sorted(store.complete_job_ids(tenant, sweep_id, versions))
        return job_ids, zip(
            job_ids, read_each(job_reader(store, tenant, sweep_id, True), job_ids, store.read_concurrency)
        )
    tags = store.list_versions(paths.jobs_prefix(tenant, sweep_id)) if versions is None else versions
    job_ids = sorted(store.complete_job_ids(tenant, sweep_id, tags))
    loaded = load_results(store, tenant, sweep_id, job_ids, tags)
    return job_ids, ((j, x if isinstance(x, CorruptRecordError) else (x, [])) for j, x in loaded)


def _read(store, tenant: str, sweep_id: str, job_id: str) -> tuple[JobResult, bytes] | CorruptRecordError:
    try:
        return store.load_result_bytes(tenant, sweep_id, job_id)
    except CorruptRecordError as err:
        return err


def _writer(header: dict) -> tuple[gzip.GzipFile, io.BytesIO]:
    buffer = io.BytesIO()
    out = gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=1, mtime=0)
    out.write(json.dumps(header).encode() + b"\n")
    return out, buffer


def _save(store, key: str, data: bytes) -> None:
    """Write the snapshot; a store that refuses the write (read-only credentials) only costs the next
    load its reads."""
    try:
        store.write_bytes(key, data)
    except StoreError as err:
        structlog.get_logger("decodebench.report").debug("snapshot.unwritten", key=key, error=str(err))
