"""Hostile input on the worker's side (issue 14, items 5 and 6), against a real redis-server and
an in-process worker: job payloads in Redis that are not decodebench jobs, and model
directories that are not models. Each fails its job for good with one reason line, in the
sweep's state and in RQ; the worker goes on with the next job."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main as cli
from tests.support.queue import rq_queue, spec_dict
from tests.support.services import SIGNING_KEY as KEY
from tests.support.services import TINY_MODEL
from tests.support.worker import conn_url, plant, run_worker, submit
from worker import sweepstate
from worker.core import keys
from worker.core.contract import ModelSpec
from worker.core.errors import PermanentJobError

pytestmark = pytest.mark.usefixtures("restore_signals")  # tests/conftest.py: the worker installs its handlers


def payload(func: str, *args, kwargs=None) -> bytes:
    return json.dumps([func, None, list(args), kwargs or {}]).encode()


def broken_payloads(spec: dict) -> dict[str, tuple[bytes, str]]:
    """name -> (the job's `data` as RQ stores it, uncompressed; a part of the expected reason)."""
    f = keys.RQ_FUNCTION
    without_model = {k: v for k, v in spec.items() if k != "model"}
    return {
        "malformed_json": (b'["worker.rq.task.run_queued_job", null, [{"tenant": ', "not readable JSON"),
        "not_utf8": (b"\xff\xfe\x00garbage", "not readable JSON"),
        "json_null": (b"null", "not readable JSON"),
        "missing_field": (payload(f, without_model), "invalid job: model: Field required"),
        "wrong_types": (payload(f, dict(spec, seed="abc")), "invalid job: seed:"),
        "model_not_an_object": (payload(f, dict(spec, model="m")), "invalid job: model:"),
        "other_function": (payload("os.system", "echo hi"), "calls 'os.system', not worker.rq.task.run_queued_job"),
        "args_not_a_dict": (payload(f, "a string"), "arguments are not one JobSpec object"),
        "two_args": (payload(f, spec, spec), "arguments are not one JobSpec object"),
        "no_ids": (payload(f, {"hello": 1}), "not a decodebench job"),
        "key_with_newlines": (payload(f, dict(spec, **{"x\ny" * 50: 1})), "invalid job: 'x\\nyx\\ny"),
        "other_tenant": (payload(f, dict(spec, tenant="team-x")), "a job of tenant 'team-x' on the queue of tenant"),
    }


def test_broken_job_payloads_fail_their_jobs_with_a_reason_and_the_worker_goes_on(conn, store, tiny_model):
    from rq.registry import FailedJobRegistry

    prompts = [f"It was the {n}th of the month" for n in range(8)]
    out = submit(conn, store, tiny_model, shard_size=1, prompts=prompts)  # 8 x (greedy + top_k x 2 seeds)
    n = len(out.enqueued)
    first = json.loads(zlib.decompress(conn.hget(keys.rq_job_key("default", out.enqueued[0]), "data")))
    broken = broken_payloads(first[2][0])
    planted = dict(zip(out.enqueued[::2], broken.items()))  # every other job, the first one included
    assert n == 24 and len(planted) == len(broken)
    for job_id, (_, (data, _)) in planted.items():  # signed: what the server should never sign, still refused
        plant(conn, job_id, data)
    conn.hset(keys.rq_job_key("default", out.enqueued[0]), "meta", b"\x00not json either")

    run_worker(conn)

    s = sweepstate.read_status(conn, "default", out.sweep_id, max_failures=50)
    assert s.complete and s.total("done") == n - len(broken) and s.total("failed") == len(broken)
    assert store.complete_job_ids("default", out.sweep_id) == set(out.enqueued) - set(planted)
    reasons = {job_id: reason for job_id, _cell, reason in s.failures}
    assert set(reasons) == set(planted)
    for job_id, (name, (_, expected)) in planted.items():
        assert expected in reasons[job_id] and "\n" not in reasons[job_id] and len(reasons[job_id]) < 300, name
        failed = rq_queue(conn).fetch_job(job_id)
        assert failed.retries_left == 0 and not failed.number_of_retries, name  # tried once
        assert failed.meta["reason"] == reasons[job_id], name
    assert FailedJobRegistry(keys.queue_name("default"), connection=conn).count == len(broken)
    assert conn.zcard(keys.running("default")) == 0  # (a refusal travels with its job: no per-worker stash to leak)
    # a finished sweep with failed jobs: status exits 1
    r = CliRunner().invoke(cli, ["status", out.sweep_id, "--redis-url", conn_url(conn)])
    assert r.exit_code == 1 and "invalid job: model: Field required" in r.output and "Traceback" not in r.output


def test_a_forged_job_no_sweep_knows_is_failed_in_rq_and_the_worker_goes_on(conn, store, tiny_model):
    from rq.registry import FailedJobRegistry

    out = submit(conn, store, tiny_model, seeds=(1,), prompts=["A"])  # 2 jobs
    plant(conn, "forged", b"{oops", origin=keys.queue_name("default"))
    conn.lpush(keys.rq_queue_key(keys.queue_name("default")), "forged")
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id)
    assert s.total("done") == 2 and s.n_failures == 0
    assert "forged" in FailedJobRegistry(keys.queue_name("default"), connection=conn).get_job_ids()
    assert "not readable JSON" in rq_queue(conn).fetch_job("forged").meta["reason"]


# -- model directories that are not models (issue 14, item 6) ----------------------------------


def _edit_config(**changes):
    def damage(d: Path) -> None:
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**config, **changes}))

    return damage


def _to_pickle(d: Path) -> None:
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()


def _cut(name: str, keep):
    def damage(d: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: keep(len(data))])

    return damage


# name -> (damage done to a copy of the bundled model, a part of the expected reason)
DAMAGES = {
    "no_config": (lambda d: (d / "config.json").unlink(), "no config.json: not a model directory"),
    "config_not_json": (lambda d: (d / "config.json").write_text("{oops"), "config.json is not valid JSON"),
    "config_a_list": (lambda d: (d / "config.json").write_text("[1, 2]"), "config.json is not a JSON object"),
    "unknown_architecture": (_edit_config(model_type="no-such-arch"), "does not recognize this architecture"),
    "other_architecture": (_edit_config(model_type="bert", architectures=["BertModel"]), "weights do not fit"),
    "other_shapes": (_edit_config(n_embd=64), "28 of another shape"),
    "pickle_only": (_to_pickle, "weights only in pickle form (pytorch_model.bin)"),
    "no_weights": (lambda d: (d / "model.safetensors").unlink(), "no weights file"),
    "empty_safetensors": (_cut("model.safetensors", lambda n: 0), "safetensors weights cannot be read"),
    "truncated_safetensors": (_cut("model.safetensors", lambda n: n // 2), "safetensors weights cannot be read"),
    "tokenizer_not_json": (_cut("tokenizer.json", lambda n: n // 2), "its tokenizer cannot load: JSONDecodeError"),
    "tokenizer_of_wrong_shape": (lambda d: (d / "tokenizer.json").write_text("{}"), "its tokenizer cannot load"),
    "tokenizer_config_a_list": (
        lambda d: (d / "tokenizer_config.json").write_text("[]"),
        "tokenizer_config.json is not a JSON object",
    ),
    "no_tokenizer": (lambda d: (d / "tokenizer.json").unlink(), "its tokenizer has 1 token(s)"),
}


def damaged(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    shutil.copytree(TINY_MODEL, d)
    DAMAGES[name][0](d)
    return d


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_a_model_directory_that_is_not_a_model_is_one_permanent_reason(tmp_path, name):
    import torch

    from worker.engine.models import load

    d = damaged(tmp_path, name)
    with pytest.raises(PermanentJobError) as info:
        load(ModelSpec(path=str(d), name=name), torch.device("cpu"))
    reason = str(info.value)
    assert reason.startswith(f"model '{name}' ({d}): ") and DAMAGES[name][1] in reason, reason
    assert "\n" not in reason and len(reason) < 400, reason


def test_pickle_weights_load_when_the_sweep_opts_in(tmp_path):
    import torch

    from worker.engine.models import load

    d = damaged(tmp_path, "pickle_only")
    loaded = load(ModelSpec(path=str(d), use_safetensors=False), torch.device("cpu"))
    assert loaded.info["n_params"] > 0 and len(loaded.tokenizer) > 1


def _flip_middle(name: str):
    def damage(d: Path) -> None:
        data = bytearray((d / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (d / name).write_bytes(bytes(data))

    return damage


# pickle weights of a sweep that opted in (use_safetensors: false), damaged after conversion
PICKLE_DAMAGES = {
    "truncated": (_cut("pytorch_model.bin", lambda n: n // 2), "an incomplete zip archive (truncated?)"),
    "empty": (_cut("pytorch_model.bin", lambda n: 0), "neither a zip archive"),
    "altered": (_flip_middle("pytorch_model.bin"), "fails its CRC"),
    "text": (lambda d: (d / "pytorch_model.bin").write_text("not weights"), "neither a zip archive"),
}


@pytest.mark.parametrize("name", sorted(PICKLE_DAMAGES))
def test_damaged_pickle_weights_of_an_opted_in_sweep_are_one_permanent_reason(tmp_path, name):
    import torch

    from worker.engine.models import load

    d = damaged(tmp_path, "pickle_only")
    damage, expected = PICKLE_DAMAGES[name]
    damage(d)
    with pytest.raises(PermanentJobError) as info:
        load(ModelSpec(path=str(d), name=name, use_safetensors=False), torch.device("cpu"))
    reason = str(info.value)
    assert "pytorch_model.bin is not a readable torch checkpoint" in reason and expected in reason, reason
    assert "\n" not in reason and len(reason) < 400, reason


def test_jobs_of_broken_models_fail_for_good_and_the_worker_goes_on(conn, store, tiny_model, tmp_path):
    from controller.launch import submit as cq
    from controller.sweep.load import parse_spec

    names = ["no_config", "other_architecture", "pickle_only", "truncated_safetensors", "tokenizer_of_wrong_shape"]
    models = [{"path": tiny_model, "name": "good"}]
    for name in names:
        shutil.copytree(TINY_MODEL, tmp_path / name)  # a model when submitted, damaged on the worker
        models.append({"path": str(tmp_path / name), "name": name})
    out = cq.submit(conn, store, parse_spec(spec_dict(models=models, seeds=(1,), prompts=["A"])), "default", key=KEY)
    for name in names:
        shutil.rmtree(tmp_path / name)
        damaged(tmp_path, name)
    run_worker(conn)
    s = sweepstate.read_status(conn, "default", out.sweep_id, max_failures=50)
    assert s.complete and s.total("done") == 2 and s.total("failed") == 2 * len(names)
    for job_id, cell, reason in s.failures:
        name = cell.split("::")[0]
        assert reason.startswith(f"model '{name}' (") and DAMAGES[name][1] in reason, reason
        assert rq_queue(conn).fetch_job(job_id).retries_left == 0  # permanent: not retried
