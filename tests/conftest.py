"""Shared fixtures: real redis-server and S3 (moto) on loopback, the bundled models; without torch, the
modules that need it skipped (so that `pytest -m pure` runs where the controller alone is installed)."""

from __future__ import annotations

import os

import pytest

from tests.support.services import PROMPTS, SIGNING_KEY, SMALL_MODEL, TINY_MODEL, redis_server, s3_env, s3_server

HEAVY = ("torch", "transformers")  # what only the worker extra installs
# Fixtures kept in tests/support beside the helpers they go with, for every test that names them.
pytest_plugins = ["tests.support.acl"]


class _Module(pytest.Module):
    """A test module that imports torch where torch is not installed is skipped with that reason, not a
    collection error: pytest collects every module before `-m pure` deselects, and a pure test never needs
    torch (tests/repo/test_layout.py). Any other import error, or a missing part of an installed torch, fails."""

    def _getobj(self):
        try:
            return super()._getobj()
        except self.CollectError as err:
            missing = getattr(err.__cause__, "name", None) if isinstance(err.__cause__, ImportError) else None
            if missing in HEAVY:
                pytest.skip(f"needs {missing}, which is not installed (the worker extra)", allow_module_level=True)
            raise


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs the main suite in 2 worker processes, scripts/run-tests.sh) each
    worker's torch, and every process it starts, takes one intra-op thread, so that two workers do not run
    four spinning threads on two cores (docs/architecture.md, "The tests"). Set before any test module
    imports torch; a developer's own OMP_NUM_THREADS stands."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_pycollect_makemodule(module_path, parent):
    return _Module.from_parent(parent, path=module_path)


@pytest.fixture(scope="session")
def redis_service():
    with redis_server() as (url, _proc):
        yield url


@pytest.fixture()
def redis_url(redis_service):
    """A flushed Redis database for one test."""
    import redis

    conn = redis.Redis.from_url(redis_service)
    conn.flushall()
    yield redis_service
    conn.flushall()


@pytest.fixture()
def conn(redis_url):
    """A client of the flushed test database (the tests that run a worker in their own process)."""
    import redis

    return redis.Redis.from_url(redis_url)


@pytest.fixture()
def store():
    """The store DECODEBENCH_STORE names (the test session's)."""
    from worker.store import open_store

    return open_store(os.environ["DECODEBENCH_STORE"])


@pytest.fixture()
def restore_signals():
    """An in-process worker installs SIGTERM/SIGINT/SIGUSR1/SIGALRM handlers: pytest's are put back."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGALRM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture(scope="session")
def s3_endpoint():
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture()
def s3_bucket(s3_endpoint, monkeypatch):
    """A fresh bucket on the loopback S3 endpoint; the env points boto3 at it. Yields its name."""
    import uuid

    import boto3

    for k, v in s3_env(s3_endpoint).items():
        monkeypatch.setenv(k, v)
    name = f"decodebench-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def tiny_model() -> str:
    assert TINY_MODEL.is_dir(), f"bundled model missing: {TINY_MODEL}"
    return str(TINY_MODEL)


@pytest.fixture(scope="session")
def small_model() -> str:
    assert SMALL_MODEL.is_dir(), f"bundled model missing: {SMALL_MODEL}"
    return str(SMALL_MODEL)


@pytest.fixture(scope="session")
def prompts_file() -> str:
    assert PROMPTS.is_file(), f"bundled prompt set missing: {PROMPTS}"
    return str(PROMPTS)


@pytest.fixture(scope="session")
def runtime():
    """One CPU runtime (device + model cache) shared by the engine tests."""
    from worker.engine.job import Runtime

    return Runtime("cpu")


@pytest.fixture(scope="session")
def signing_key_file(tmp_path_factory) -> str:
    """The session's job signing key (SIGNING_KEY), in a file as the chart mounts it."""
    path = tmp_path_factory.mktemp("signing") / "job-signing-key"
    path.write_bytes(SIGNING_KEY + b"\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture(autouse=True)
def _no_user_env(monkeypatch, tmp_path, signing_key_file):
    """Tests never see the developer's DECODEBENCH_* settings; ./runs goes to a temp dir; jobs are
    signed and checked with the session's key (DECODEBENCH_SIGNING_KEY_FILE)."""
    for key in list(os.environ):
        if key.startswith("DECODEBENCH_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DECODEBENCH_STORE", str(tmp_path / "runs"))
    monkeypatch.setenv("DECODEBENCH_SIGNING_KEY_FILE", signing_key_file)
