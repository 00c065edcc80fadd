"""The submission server's HTTP API fuzzed from its own OpenAPI schema (Schemathesis), as the sweep files are
fuzzed (tests/test_hostile_properties.py): property-based requests to every operation, with a valid token
and without one, against a real `decodebench serve` on loopback with a real redis-server. No answer is a
500 or carries a traceback, and every answer is one of the server's own (JSON, one line for an error).

Bounded: a few examples per operation (FUZZ_EXAMPLES), no shrinking past what Hypothesis does by default,
each request under the client's timeout.
"""

from __future__ import annotations

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, Phase, settings

from tests.helpers_server import deployment

pytestmark = pytest.mark.slow
FUZZ_EXAMPLES = 25  # per operation: ~12 operations, a few hundred requests, tens of seconds


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory, redis_service, signing_key_file, tiny_model):
    """A server with its schema on (behind a token), and the token the cases send."""
    redis.Redis.from_url(redis_service).flushall()
    tmp = tmp_path_factory.mktemp("fuzz")
    with deployment(tmp, redis_service, signing_key_file, tiny_model, DECODEBENCH_API_OPENAPI="1") as dep:
        yield dep
    redis.Redis.from_url(redis_service).flushall()


@pytest.fixture(scope="module")
def api_schema(fuzzed):
    auth = {"Authorization": f"Bearer {fuzzed.tokens['alice']}"}
    return schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json", headers=auth)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_request_is_answered_with_a_server_error(case, fuzzed):
    for headers in ({"Authorization": f"Bearer {fuzzed.tokens['alice']}"}, {}):
        response = case.call(headers=headers, timeout=30)
        assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])
        assert "Traceback" not in response.text
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error, str) and "\n" not in error
