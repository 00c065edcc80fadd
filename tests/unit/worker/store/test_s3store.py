"""Store conformance, shared by FileStore and S3Store (moto's S3 server on loopback), and
S3 behind a real failing HTTP hop: a loopback proxy that answers 503 or drops responses."""

from __future__ import annotations

import contextlib
import http.client
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from worker.core.errors import StoreError
from worker.store import FileStore, open_store


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return FileStore(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/runs/team")


def test_write_read_overwrite(store):
    assert store.write_bytes("a/b/c.txt", b"one") is True
    assert store.read_bytes("a/b/c.txt") == b"one"
    assert store.write_bytes("a/b/c.txt", b"two") is True
    assert store.read_bytes("a/b/c.txt") == b"two"
    store.write_json("a/x.json", {"k": [1, 2]})
    assert store.read_json("a/x.json") == {"k": [1, 2]}
    store.write_jsonl("a/y.jsonl", [{"i": 1}, {"i": 2}])
    assert list(store.read_jsonl("a/y.jsonl")) == [{"i": 1}, {"i": 2}]


def test_create_only_never_overwrites(store):
    assert store.write_bytes("jobs/j1/result.json", b"first", create_only=True) is True
    assert store.write_bytes("jobs/j1/result.json", b"second", create_only=True) is False
    assert store.read_bytes("jobs/j1/result.json") == b"first"


def test_create_only_has_exactly_one_winner_among_concurrent_writers(store):
    def attempt(i: int) -> bool:
        return store.write_bytes("jobs/j2/result.json", f"writer {i}".encode(), create_only=True)

    with ThreadPoolExecutor(8) as pool:
        wins = list(pool.map(attempt, range(8)))
    assert wins.count(True) == 1
    assert store.read_bytes("jobs/j2/result.json") == f"writer {wins.index(True)}".encode()


def test_exists_delete_and_missing(store):
    assert not store.exists("nope.json")
    with pytest.raises(StoreError, match="does not exist"):
        store.read_bytes("nope.json")
    store.write_bytes("k.txt", b"x")
    assert store.exists("k.txt")
    store.delete("k.txt")
    store.delete("k.txt")  # deleting twice is fine
    assert not store.exists("k.txt")


def test_listing_is_sorted_and_scoped_to_the_prefix(store):
    for key in (
        "t/sweeps/s2/spec.json",
        "t/sweeps/s1/jobs/b/result.json",
        "t/sweeps/s1/spec.json",
        "t/sweeps/s1/jobs/a/result.json",
        "t/sweeps/s1/jobs/a/log.jsonl",
        "u/sweeps/s9/spec.json",
    ):
        store.write_bytes(key, b"{}")
    assert store.list("t/sweeps/s1/jobs/") == [
        "t/sweeps/s1/jobs/a/log.jsonl",
        "t/sweeps/s1/jobs/a/result.json",
        "t/sweeps/s1/jobs/b/result.json",
    ]
    assert store.list("t/sweeps/") == sorted(k for k in store.list("t/") if k.startswith("t/sweeps/"))
    assert store.list("missing/") == []
    assert store.complete_job_ids("t", "s1") == {"a", "b"}
    assert store.list_sweeps("t") == ["s1", "s2"]


def test_check_and_keys_that_escape(store):
    store.check()
    with pytest.raises(StoreError):
        store.write_bytes("../outside", b"x")


def test_s3_url_layout_and_settings(s3_bucket, s3_endpoint):
    import boto3

    store = open_store(f"s3://{s3_bucket}/pre/fix/")
    assert store.url == f"s3://{s3_bucket}/pre/fix" and store.endpoint_url == s3_endpoint
    store.write_bytes("default/sweeps/s/spec.json", b"{}")
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert keys == ["pre/fix/default/sweeps/s/spec.json"]


def test_s3_missing_bucket_fails_check_with_one_line(s3_endpoint, s3_bucket):
    store = open_store("s3://no-such-bucket-here/x")
    store.retry_s = 0
    with pytest.raises(StoreError, match="no-such-bucket-here"):
        store.check()


# -- a failing HTTP hop ---------------------------------------------------------------------


class FlakyProxy:
    """Forwards to the S3 endpoint; `fail` requests get a 503, `drop` are forwarded and their
    response is lost (the connection closes), as with a network cut after the server acted."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.fail = 0
        self.drop = 0
        self.seen: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.seen.append(self.command)
                if proxy.fail > 0:
                    proxy.fail -= 1
                    payload = b"<Error><Code>ServiceUnavailable</Code><Message>flaky</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                upstream = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                resp = upstream.getresponse()
                data = resp.read()
                if proxy.drop > 0 and self.command == "PUT":
                    proxy.drop -= 1
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass  # a client that hangs up on a dropped response is expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture()
def flaky(s3_endpoint, s3_bucket, monkeypatch):
    proxy = FlakyProxy(s3_endpoint)
    monkeypatch.setenv("DECODEBENCH_S3_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("DECODEBENCH_S3_RETRY_BASE_S", "0.05")
    monkeypatch.setenv("DECODEBENCH_S3_MAX_ATTEMPTS", "2")
    with contextlib.closing(proxy):
        yield proxy, open_store(f"s3://{s3_bucket}/flaky")


def test_a_store_that_fails_for_a_while_is_retried_not_lost(flaky):
    proxy, store = flaky
    proxy.fail = 7  # more than botocore's own attempts: our backoff takes over
    assert store.write_bytes("j/result.json", b"payload", create_only=True) is True
    proxy.fail = 5
    assert store.read_bytes("j/result.json") == b"payload"
    proxy.fail = 5
    assert store.list("j/") == ["j/result.json"]
    assert proxy.seen.count("PUT") >= 2


def test_an_outage_longer_than_the_retry_budget_is_an_error_not_a_silent_loss(flaky):
    proxy, store = flaky
    store.retry_s = 0.5
    proxy.fail = 10_000
    with pytest.raises(StoreError, match="failed after"):
        store.write_bytes("j/result.json", b"payload", create_only=True)


def test_a_lost_response_to_a_conditional_put_is_not_a_duplicate(flaky):
    proxy, store = flaky
    proxy.drop = 1  # the first PUT lands on the server but its response is lost; botocore retries
    assert store.write_bytes("j/result.json", b"mine", create_only=True) is True
    assert proxy.seen.count("PUT") >= 2
    assert store.write_bytes("j/result.json", b"a second attempt's", create_only=True) is False
    assert store.read_bytes("j/result.json") == b"mine"


def test_a_job_writes_its_result_generations_and_log_to_s3_through_failures(flaky, tiny_model, runtime):
    import structlog

    from controller.sweep.load import parse_spec
    from controller.sweep.plan import plan
    from tests.support.queue import spec_dict
    from worker.core import paths
    from worker.core.logs import configure
    from worker.engine.job import run_job

    configure("json")  # the job's log lines are captured for its log.jsonl
    proxy, store = flaky
    job = plan(parse_spec(spec_dict(tiny_model, prompts=["It was", "She said"])), "default")[0]
    proxy.fail = 4
    out = run_job(job, store=store, runtime=runtime)
    assert out["status"] == "done"
    t, s, j = job.tenant, job.sweep_id, job.job_id
    assert store.load_result(t, s, j).n_generations == 2
    assert [g.prompt_id for g in store.load_generations(t, s, j)] == [p.id for p in job.prompts]
    events = [row["event"] for row in store.read_jsonl(paths.log_key(t, s, j))]
    assert "job.start" in events and "job.done" in events and "s3.retry" in events  # the retries are in the job log too
    assert run_job(job, store=store, runtime=runtime)["status"] == "skipped"
    structlog.reset_defaults()
