"""The sweep's results snapshot (controller.report.load.snapshot): a repeated load of a sweep reads from the
store only the results that changed since the last load (new, retried, rewritten), on the file store
and on the loopback S3 endpoint; a damaged, foreign or forged snapshot costs reads, never a wrong
result."""

from __future__ import annotations

import gzip
import json

import pytest

from controller.report.compute.aggregate import summarize
from controller.report.load import snapshot
from controller.report.load.sweep import load_sweep
from tests.support.report import CELLS, make_sweep, write_with_hashes
from worker.core import paths
from worker.core.errors import StoreError
from worker.store import FileStore, open_store


def results_read(store, monkeypatch) -> list[str]:
    """The job ids of every result.json this store instance reads from now on."""
    read: list[str] = []
    real = store.read_bytes

    def read_bytes(key: str, limit: int | None = None) -> bytes:
        if key.endswith("/result.json"):
            read.append(key.rsplit("/", 2)[1])
        return real(key, limit)

    monkeypatch.setattr(store, "read_bytes", read_bytes)
    return read


def view(data) -> list:
    """What a load gives of each job, to compare two loads."""
    return [
        (r.job.job_id, r.job.cell, r.job.seed, r.generations_sha256, [(b.new_tokens, b.total_s) for b in r.batches])
        for r in data.results
    ]


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return FileStore(tmp_path / "s")
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/runs")


def test_a_second_load_reads_only_what_changed(store, monkeypatch):
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:3])
    write_with_hashes(store, data)
    read = results_read(store, monkeypatch)
    first = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert len(read) == len(data.results) and store.exists(snapshot.key_of(data.tenant, data.sweep_id))
    read.clear()
    compressed: list[dict] = []
    real_writer = snapshot._writer
    monkeypatch.setattr(snapshot, "_writer", lambda header: (compressed.append(header), real_writer(header))[1])
    second = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert read == [] and view(second) == view(first)
    assert compressed == []  # nothing changed: the snapshot is neither re-compressed nor written
    pd_first = summarize(first, n_boot=50, store=store)
    assert summarize(second, n_boot=50, store=store).equals(pd_first)

    # a retried job (rewritten with other timings) is read again, and only it
    job = data.results[0].job
    key = paths.result_key(data.tenant, data.sweep_id, job.job_id)
    doc = store.read_json(key)
    doc["batches"][0]["total_s"] *= 2
    store.write_json(key, doc)
    read.clear()
    third = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert read == [job.job_id]
    got = next(r for r in third.results if r.job.job_id == job.job_id)
    assert got.batches[0].total_s == doc["batches"][0]["total_s"]
    read.clear()
    assert view(load_sweep(store, data.tenant, data.sweep_id, with_generations=False)) == view(third)
    assert read == []  # the snapshot was written afresh


def test_a_job_that_completes_later_is_read_and_one_that_is_gone_is_left_out(tmp_path, monkeypatch):
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2])
    write_with_hashes(store, data)
    late, gone = data.results[1].job.job_id, data.results[2].job.job_id
    late_key = paths.result_key(data.tenant, data.sweep_id, late)
    body = store.read_bytes(late_key)
    store.delete(late_key)
    load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    store.write_bytes(late_key, body)
    store.delete(paths.result_key(data.tenant, data.sweep_id, gone))
    read = results_read(store, monkeypatch)
    loaded = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert read == [late]
    assert {r.job.job_id for r in loaded.results} == {r.job.job_id for r in data.results} - {gone}


def _entries(store, data) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The snapshot's header line and its (head line, result bytes) entries, parsed here."""
    with gzip.open(store.root / snapshot.key_of(data.tenant, data.sweep_id)) as f:
        raw = f.read()
    header, _, rest = raw.partition(b"\n")
    entries = []
    while rest:
        head, _, rest = rest.partition(b"\n")
        size = json.loads(head)["size"]
        entries.append((head + b"\n", rest[:size]))
        assert rest[size : size + 1] == b"\n"
        rest = rest[size + 1 :]
    return header + b"\n", entries


def _join(entries) -> bytes:
    return b"".join(head + body + b"\n" for head, body in entries)


def _damage(kind: str, header: bytes, entries: list[tuple[bytes, bytes]], data) -> bytes:
    """The snapshot's bytes, damaged one way."""
    if kind == "garbage":
        return b"not gzip at all"
    if kind == "truncated":
        return gzip.compress(header + _join(entries))[:-200]
    if kind == "another sweep":
        other = json.dumps({"v": snapshot.VERSION, "tenant": data.tenant, "sweep_id": "sweepzzzzzzzzzzz"}).encode()
        return gzip.compress(other + b"\n" + _join(entries))
    if kind == "out of order":
        return gzip.compress(header + _join(entries[::-1]))
    (head, _), (_, body1) = entries[0], entries[1]
    size = json.loads(head)
    if kind == "forged":  # the first entry's job and tag, with the second job's result
        forged = json.dumps(size | {"size": len(body1)}).encode() + b"\n"
        return gzip.compress(header + _join([(forged, body1), *entries[1:]]))
    if kind == "too long":  # a size past MAX_LINE
        huge = json.dumps(size | {"size": snapshot.MAX_LINE + 1}).encode() + b"\n"
        return gzip.compress(header + _join([(huge, b"{}"), *entries[1:]]))
    if kind == "wrong size":
        short = json.dumps(size | {"size": 5}).encode() + b"\n"
        return gzip.compress(header + _join([(short, entries[0][1]), *entries[1:]]))
    raise AssertionError(kind)


KINDS = ["garbage", "truncated", "another sweep", "out of order", "forged", "too long", "wrong size"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_or_forged_snapshot_costs_reads_never_a_wrong_result(tmp_path, monkeypatch, kind):
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2])
    write_with_hashes(store, data)
    want = view(load_sweep(store, data.tenant, data.sweep_id, with_generations=False))
    key = snapshot.key_of(data.tenant, data.sweep_id)
    store.write_bytes(key, _damage(kind, *_entries(store, data), data))
    read = results_read(store, monkeypatch)
    assert view(load_sweep(store, data.tenant, data.sweep_id, with_generations=False)) == want
    assert read  # some (or all) read from the store again
    if kind == "forged":
        assert read == [min(r.job.job_id for r in data.results)]  # the forged entry's own job only
    read.clear()
    assert view(load_sweep(store, data.tenant, data.sweep_id, with_generations=False)) == want
    assert read == []  # replaced by a whole one


def test_a_damaged_result_is_still_named_and_read_again_once_mended(tmp_path, monkeypatch):
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:2])
    write_with_hashes(store, data)
    job_id = data.results[0].job.job_id
    key = paths.result_key(data.tenant, data.sweep_id, job_id)
    body = store.read_bytes(key)
    store.write_bytes(key, body[:40])  # a worker killed mid-write
    loaded = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert any(job_id in line for line in loaded.damaged) and job_id not in {r.job.job_id for r in loaded.results}
    store.write_bytes(key, body)
    read = results_read(store, monkeypatch)
    loaded = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert read == [job_id] and not loaded.damaged


def test_a_store_that_refuses_the_snapshot_only_costs_the_reads(tmp_path, monkeypatch):
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:1])
    write_with_hashes(store, data)
    real = store.write_bytes

    def write_bytes(key: str, body: bytes, **kw) -> bool:
        if key.endswith(snapshot.NAME):
            raise StoreError("AccessDenied")
        return real(key, body, **kw)

    monkeypatch.setattr(store, "write_bytes", write_bytes)
    for _ in range(2):
        assert len(load_sweep(store, data.tenant, data.sweep_id, with_generations=False).results) == len(data.results)


def test_a_planted_snapshot_of_millions_of_entries_is_read_no_further_than_the_sweep_needs(tmp_path):
    """A tenant's planted file could hold millions of tiny valid entries (a gzip of a few MB): the
    submission server, which plans from the same load, reads at most the sweep's jobs plus SLACK."""
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:1])
    write_with_hashes(store, data)
    want = view(load_sweep(store, data.tenant, data.sweep_id, with_generations=False))
    header, _ = _entries(store, data)
    many = b"".join(b'{"job":"%08d","tag":"t","size":1}\n1\n' % i for i in range(200_000))
    planted = gzip.compress(header + many)
    store.write_bytes(snapshot.key_of(data.tenant, data.sweep_id), planted)
    found = list(snapshot._entries(planted, json.loads(header), False, limit=len(data.results) + snapshot.SLACK))
    assert len(found) == len(data.results) + snapshot.SLACK
    assert view(load_sweep(store, data.tenant, data.sweep_id, with_generations=False)) == want


def test_a_snapshot_inflates_at_most_its_limit_and_the_rest_is_read_from_the_store(tmp_path, monkeypatch):
    """A snapshot of highly compressible entries costs a load at most DECODEBENCH_REPORT_SNAPSHOT_MAX_MB of
    inflation: the entries past it are read from the store, and the results are the same."""
    store = FileStore(tmp_path / "s")
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=CELLS[:3])
    write_with_hashes(store, data)
    first = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    size = sum(len(store.read_bytes(paths.result_key(data.tenant, data.sweep_id, r.job.job_id))) for r in data.results)
    monkeypatch.setenv("DECODEBENCH_REPORT_SNAPSHOT_MAX_MB", str(size / 2 / 2**20))  # about half of the entries
    read = results_read(store, monkeypatch)
    second = load_sweep(store, data.tenant, data.sweep_id, with_generations=False)
    assert 0 < len(read) < len(data.results) and view(second) == view(first)
