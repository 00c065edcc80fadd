"""What a crafted request does to the submission server's door (issue: the body check, 500s, ids): each attack
is a test on real processes (`decodebench serve` on loopback, redis-server, the file store), and each fails on
the code before its fix.

- The body check is linear: a string that never closes is scanned once, as the same string closed is (it was
  quadratic: 15 s of the event loop for 60 KB).
- A spec nested deeper than a sweep file may be, or text that is not valid Unicode anywhere in a body (or in a
  stored spec.json a retry plans), is a 400 in one line naming the path and one audit line, never a 500.
- A bug is a 500 with one audit line and its traceback logged once, without the frames' locals.
- An id with a trailing newline is not an id.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.server.app import _STRING, json_values
from tests.support.repo import REPO
from tests.support.server import deployment
from worker.core import paths
from worker.store import FileStore

pytestmark = pytest.mark.slow
LIMIT = 64  # controller.sweep.yamlsafe.MAX_DEPTH: a sweep file's levels


def test_the_body_check_scans_a_string_once_whether_it_closes_or_not():
    """Every quote of `"\\"\\"\\"...` starts a string that never closes; the old pattern failed at the end of each
    and scanned again from the next quote (16 KiB: a second; 60 KB: 15 s, on the event loop). Now the pattern
    matches a string that never closes to the end of the body, once: one match, so one scan (no timing here)."""
    escaped = b'\\"' * 2**11
    closed, unclosed = b'["' + escaped + b'"]', b'["' + escaped
    assert [m.span() for m in _STRING.finditer(unclosed)] == [(1, len(unclosed))]
    assert [m.span() for m in _STRING.finditer(closed)] == [(1, len(closed) - 1)]
    assert json_values(unclosed) == json_values(closed) == 1


def _nested(levels: int):
    value: object = 1
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def _spec(model: str, **changes) -> dict:
    spec = {
        "name": "door",
        "models": [{"path": model, "name": "tiny"}],
        "prompts": {"inline": ["fine"]},
        "strategies": [{"name": "greedy"}],
        "generation": {"max_new_tokens": 4},
    }
    spec.update(changes)
    return spec


def _audit(dep) -> list[dict]:
    lines = [json.loads(line) for line in dep.log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "audit"]


def test_a_crafted_spec_is_one_line_400_naming_the_path_never_a_500(tmp_path, redis_url, signing_key_file):
    # template variables on a model with a chat template: on one without, they are refused as never sent
    chat_model = str(REPO / "examples" / "models" / "austen-tiny-chat")
    # chat_template_kwargs: a spec's levels (the spec, models, [0], the kwargs: 4) and the value's
    deep = _spec(chat_model, models=[{"path": chat_model, "name": "tiny", "chat_template_kwargs": {"x": {}}}])
    deep["models"][0]["chat_template_kwargs"]["x"] = _nested(LIMIT - 3)  # 65 levels: one too many
    deeper = json.loads(json.dumps(deep))
    deeper["models"][0]["chat_template_kwargs"]["x"] = _nested(300)  # 2 KB: pydantic's serialiser gave up (500)
    too_deep = "request body: spec.models[0].chat_template_kwargs.x.a.a.a...: nested deeper than 64 levels"
    cases = {
        "deep": (deep, too_deep),
        "deeper": (deeper, too_deep),
        "stop": (
            _spec(chat_model, generation={"max_new_tokens": 4, "stop": ["\ud800"]}),
            "request body: spec.generation.stop[0]: not valid Unicode: a lone surrogate U+D800 at character 1",
        ),
        "system": (
            _spec(chat_model, models=[{"path": chat_model, "name": "tiny", "system": "be \udfff"}]),
            "request body: spec.models[0].system: not valid Unicode: a lone surrogate U+DFFF at character 4",
        ),
        "key": (
            _spec(chat_model, generation={"max_new_tokens": 4, "\ud800": 1}),
            "request body: spec.generation: a key is not valid Unicode: a lone surrogate U+D800 at character 1",
        ),
    }
    with deployment(tmp_path / "d", redis_url, signing_key_file, chat_model) as dep, dep.client("alice") as http:
        for name, (spec, error) in cases.items():
            body = json.dumps({"spec": spec})  # ASCII: a lone surrogate travels as "\ud800"
            r = http.post("/v1/sweeps", content=body, headers={"Content-Type": "application/json"})
            assert (r.status_code, r.json()) == (400, {"error": error}), name
        at_limit = json.loads(json.dumps(deep))
        at_limit["models"][0]["chat_template_kwargs"]["x"] = _nested(LIMIT - 4)
        assert http.post("/v1/sweeps", json={"spec": at_limit}).status_code == 201  # as deep as a file may be
        # an id with a trailing newline is not an id (`$` matched before it)
        r = http.get("/v1/sweeps/3f2a%0A")
        assert r.status_code == 400 and r.json()["error"] == (
            "sweep '3f2a\\n' is not a sweep id (up to 64 letters, digits, '_', '-')"
        )
    audits = _audit(dep)
    assert [(a["action"], a["status"]) for a in audits if a["action"] != "/healthz"] == [
        *[("submit", 400)] * len(cases),
        ("submit", 201),
        ("status", 400),
    ]
    assert "Traceback" not in dep.log.read_text()
    # the same depth as a sweep file: `decodebench validate` says the same of the same spec
    from controller.cli import main as cli

    spec_file = tmp_path / "deep.json"
    spec_file.write_text(json.dumps(deep))
    out = CliRunner().invoke(cli, ["validate", str(spec_file)])
    assert out.exit_code == 2 and "nested deeper than 64 levels" in out.output, out.output
    spec_file.write_text(json.dumps(at_limit))
    assert CliRunner().invoke(cli, ["validate", str(spec_file)]).exit_code == 0


def test_retry_of_a_stored_spec_rewritten_too_deep_or_with_a_lone_surrogate_is_one_line(
    tmp_path, redis_url, signing_key_file, tiny_model
):
    with deployment(tmp_path / "d", redis_url, signing_key_file, tiny_model) as dep, dep.client("alice") as http:
        r = http.post("/v1/sweeps", json={"spec": _spec(tiny_model, name="rewritten")})
        assert r.status_code == 201, r.text
        sweep_id = r.json()["sweep_id"]
        http.post(f"/v1/sweeps/{sweep_id}/cancel")
        store = FileStore(dep.extra["store"])
        key = paths.spec_key("team-a", sweep_id)
        answers, original = [], store.read_bytes(key)
        for field, value in (("chat_template_kwargs", {"x": _nested(300)}), ("system", "\udc80")):
            stored = json.loads(original)
            stored["spec"]["models"][0][field] = value
            store.write_bytes(key, json.dumps(stored).encode())  # the tenant's S3 keys may write its spec.json
            r = http.post(f"/v1/sweeps/{sweep_id}/retry", json={})
            answers.append((r.status_code, r.json()["error"]))
    where = f"stored spec of sweep {sweep_id}: spec.models[0]"
    assert answers == [
        (400, f"{where}.chat_template_kwargs.x.a.a.a...: nested deeper than 64 levels"),  # was a 500
        (400, f"{where}.system: not valid Unicode: a lone surrogate U+DC80 at character 1"),
    ]


# A bug planted in the server process (as any bug would be): the tenants' overview raises with a large local.
PLANTED = """
import controller.server.service as service

def tenants_overview(ctx, who):
    request_body_held_here = "LOCAL-CANARY-" * 100_000
    raise RuntimeError("planted bug " + str(len(request_body_held_here)))

service.tenants_overview = tenants_overview
"""


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_bug_is_one_500_one_audit_line_and_one_traceback_without_locals(
    fmt, tmp_path, redis_url, signing_key_file, tiny_model
):
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(PLANTED)
    env = {"PYTHONPATH": f"{plant}:{REPO}", "DECODEBENCH_LOG_FORMAT": fmt}
    with deployment(tmp_path / "d", redis_url, signing_key_file, tiny_model, **env) as dep:
        with dep.client("alice") as http:
            r = http.get("/v1/tenants")
            assert http.get("/v1/whoami").status_code == 200  # the connection and the server still serve
        rid = r.json()["error"].split("(request ")[1].split(")")[0]
        assert r.status_code == 500
        assert r.json() == {"error": f"internal error (request {rid}); the server's log has the details"}
    log = Path(dep.log).read_text()
    assert log.count("planted bug 1300000") == 1, log[-3000:]  # the traceback once: not uvicorn's as well
    assert "Exception in ASGI application" not in log
    assert "LOCAL-CANARY" not in log and len(log) < 200_000  # no frame's locals
    if fmt == "json":
        audits = [a for a in _audit(dep) if a["request_id"] == rid]
        assert len(audits) == 1 and audits[0]["status"] == 500 and audits[0]["action"] == "tenants", audits
    else:
        audits = [line for line in log.splitlines() if "audit" in line and rid in line]
        assert len(audits) == 1 and "status=500" in audits[0], audits
