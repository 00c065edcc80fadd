"""Job signatures, bounded inflation and the per-job policy, as plain functions (no Redis, no torch).
The worker-side attacks they stop are in tests/hostile/test_worker_obeys.py."""

from __future__ import annotations

import zlib

import pytest

from controller.sweep.load import parse_spec
from controller.sweep.plan import plan
from tests.support.queue import spec_dict
from worker.core import signing
from worker.core.errors import PermanentJobError, UsageError
from worker.core.policy import Limits, context_refusal, job_models, job_refusal, model_positions
from worker.core.tenants import parse_tenants

pytestmark = pytest.mark.pure
KEY = b"k" * 32


def test_load_key_refuses_unset_unreadable_and_short_keys_in_one_line(tmp_path):
    for path, message in (
        (None, "DECODEBENCH_SIGNING_KEY_FILE is not set"),
        (tmp_path / "missing", "cannot read the signing key file"),
        (tmp_path, "cannot read the signing key file"),
    ):
        with pytest.raises(UsageError, match=message) as info:
            signing.load_key(path)
        assert "\n" not in str(info.value)
    (tmp_path / "short").write_bytes(b"x" * 31 + b"\n")
    with pytest.raises(UsageError, match="the signing key is 31 bytes; use at least 32"):
        signing.load_key(tmp_path / "short")
    (tmp_path / "good").write_bytes(KEY + b"\n")
    assert signing.load_key(str(tmp_path / "good")) == KEY


def test_a_signature_binds_key_tenant_job_and_the_stored_bytes():
    data = zlib.compress(b'["worker.rq.task.run_queued_job", null, [{}], {}]')
    sig = signing.sign(KEY, "team-a", "j1", data)
    assert len(sig) == 64 and signing.verify(KEY, "team-a", "j1", data, sig)
    assert signing.verify(KEY, "team-a", "j1", data, sig.encode())
    assert not signing.verify(KEY, "team-b", "j1", data, sig)
    assert not signing.verify(KEY, "team-a", "j2", data, sig)
    assert not signing.verify(KEY, "team-a", "j1", data + b"\0", sig)
    assert not signing.verify(b"other" * 8, "team-a", "j1", data, sig)
    assert not signing.verify(KEY, "team-a\nj1", "", data, sig)  # the separators are part of the message
    for bad in (None, "", sig[:-1], "zz" * 32, b"\xff" * 64, 42):
        assert not signing.verify(KEY, "team-a", "j1", data, bad)


def test_inflate_stops_at_its_cap_and_refuses_what_is_not_one_zlib_stream():
    assert signing.inflate(zlib.compress(b"a" * 1000), 1000) == b"a" * 1000
    with pytest.raises(PermanentJobError, match="inflates past 999 bytes"):
        signing.inflate(zlib.compress(b"a" * 1000), 999)
    for bad, why in (
        (b"not zlib", "not zlib data"),
        (zlib.compress(b"abc") + b"tail", "not one complete zlib stream"),
        (zlib.compress(b"abcdef" * 100)[:-5], "not one complete zlib stream"),
        (b"", "not one complete zlib stream"),
    ):
        with pytest.raises(PermanentJobError, match=why):
            signing.inflate(bad, 10_000)


def job(**changes):
    spec = spec_dict("/m/tiny", seeds=(1,), prompts=["A"])
    spec.update(changes)
    return plan(parse_spec(spec), "team-a")[0]


def test_job_models_names_every_role():
    j = job(
        scorer={"path": "/m/scorer"},
        featurizer={"path": "/m/feat", "revision": "r1"},
        strategies=[{"name": "assisted", "params": {"assistant": "/m/draft"}}],
    )
    roles = [(role, spec.path, spec.revision) for role, spec in job_models(j)]
    assert roles == [
        ("model", "/m/tiny", None),
        ("scorer", "/m/scorer", None),
        ("featurizer", "/m/feat", "r1"),
        ("assistant", "/m/draft", None),
    ]


def test_job_refusal_names_the_role_the_parameter_and_the_limit():
    tenant = parse_tenants({"tenants": [{"name": "team-a", "models": ["/m/tiny", "/m/feat@r1"]}]}).tenants[0]
    limits = Limits()
    assert job_refusal(job(), tenant, limits) is None
    assert job_refusal(job(featurizer={"path": "/m/feat", "revision": "r1"}), tenant, limits) is None
    cases = {
        "refused: scorer '/m/scorer' is not among tenant team-a's models": job(scorer={"path": "/m/scorer"}),
        "refused: featurizer '/m/feat@r2' is not among": job(featurizer={"path": "/m/feat", "revision": "r2"}),
        "refused: assistant '/m/draft' is not among": job(
            strategies=[{"name": "assisted", "params": {"assistant": "/m/draft"}}]
        ),
        "refused: model '/m/tiny' asks for trust_remote_code": job(
            models=[{"path": "/m/tiny", "name": "m", "trust_remote_code": True}]
        ),
        "refused: beam num_beams=65 is over the limit of 64 (DECODEBENCH_MAX_NUM_BEAMS)": job(
            strategies=[{"name": "beam", "params": {"num_beams": 65}}]
        ),
        "refused: diverse_beam num_beam_groups=17 is over the limit of 16": job(
            strategies=[{"name": "diverse_beam", "params": {"num_beams": 34, "num_beam_groups": 17}}]
        ),
        "refused: contrastive k=65 is over the limit of 64 (DECODEBENCH_MAX_CANDIDATES)": job(
            strategies=[{"name": "contrastive", "params": {"k": 65}}]
        ),
    }
    for expected, j in cases.items():
        why = job_refusal(j, tenant, limits)
        assert why is not None and why.startswith(expected), why
    # no tenants file: only the limits apply
    assert job_refusal(job(scorer={"path": "/m/scorer"}), None, limits) is None
    assert job_refusal(job(strategies=[{"name": "top_k", "params": {"k": 10_000}}]), None, limits) is None  # not a cost


def test_limits_come_from_settings(monkeypatch):
    monkeypatch.setenv("DECODEBENCH_MAX_NUM_BEAMS", "8")
    assert Limits.from_settings() == Limits(max_num_beams=8)
    assert job_refusal(job(strategies=[{"name": "beam", "params": {"num_beams": 9}}]), None, Limits.from_settings())


def test_model_positions_and_the_context_check():
    assert model_positions({"n_positions": 256, "n_ctx": 128}) == 256
    assert model_positions({"max_position_embeddings": 4096}) == 4096
    assert model_positions({"text_config": {"max_position_embeddings": 8192}}) == 8192
    assert model_positions({"hidden_size": 64}) is None and model_positions({"n_ctx": True}) is None
    assert context_refusal(256, 200, 56, "tiny") is None
    assert context_refusal(None, 10**6, 10**6, "tiny") is None
    why = context_refusal(256, 200, 57, "tiny")
    assert why == (
        "model 'tiny' takes 256 positions: the longest prompt (200 tokens) plus max_new_tokens (57) is 257; "
        "shorten one of them"
    )
