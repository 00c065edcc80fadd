"""The submission server's HTTP API fuzzed from its own OpenAPI schema (Schemathesis), as the sweep files are
fuzzed (tests/hostile/test_hostile_properties.py): property-based requests to every operation, with a valid token
and without one, against a real `decodebench serve` on loopback with a real redis-server. No answer is a
500 or carries a traceback, and every error is one JSON line.

The schema is the server's own (`/openapi.json` of a server with DECODEBENCH_API_OPENAPI on, the same
document `app.openapi()` builds, taken here from the app so that the cases are collected before any server
runs). Bounded: FUZZ_EXAMPLES per operation, each request under the client's timeout.
"""

from __future__ import annotations

import httpx
import pytest
import redis
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, settings

from controller.server.app import router
from tests.support.server import deployment

pytestmark = pytest.mark.slow
FUZZ_EXAMPLES = 5  # per operation: 13 operations, about 130 requests with and without a token


def _schema() -> dict:
    app = FastAPI(title="decodebench submission server")
    app.include_router(router)
    return app.openapi()


schema = schemathesis.openapi.from_dict(_schema())


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory, redis_service, signing_key_file, tiny_model):
    """A server with its schema on (behind a token); the cases go to it."""
    redis.Redis.from_url(redis_service).flushall()
    tmp = tmp_path_factory.mktemp("fuzz")
    with deployment(tmp, redis_service, signing_key_file, tiny_model, DECODEBENCH_API_OPENAPI="1") as dep:
        yield dep
    redis.Redis.from_url(redis_service).flushall()


def test_the_schema_fuzzed_is_the_one_the_server_serves(fuzzed):
    with fuzzed.client("alice") as http:
        assert http.get("/openapi.json").json()["paths"] == _schema()["paths"]


@schema.parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_request_is_answered_with_a_server_error(case, fuzzed):
    for headers in ({"Authorization": f"Bearer {fuzzed.tokens['alice']}"}, {}):
        response = case.call(base_url=fuzzed.url, headers=headers, timeout=30)
        where = (case.method, case.formatted_path, response.status_code, response.text[:300])
        assert response.status_code < 500, where
        assert "Traceback" not in response.text, where
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error, str) and "\n" not in error, where
    assert httpx.get(f"{fuzzed.url}/healthz").status_code == 200  # still answering
