"""The engine axis of a sweep (issue 26): old sweeps keep their ids and cells, other engines add
cells `model::variant::engine`, bad engine input is one line at validation, unsupported
strategy x engine pairs are refused by name, never run as something else."""

from __future__ import annotations

import pytest

from controller.launch.local import check_engines
from controller.sweep.load import load_spec, parse_spec
from controller.sweep.plan import plan
from tests.support.repo import REPO
from worker.core.errors import UsageError
from worker.core.policy import Limits, job_refusal

pytestmark = pytest.mark.pure
QUICKSTART = REPO / "examples" / "quickstart.yaml"


def spec(**over):
    data = {
        "name": "e",
        "models": [{"path": "org/model-a"}],
        "prompts": {"inline": [f"prompt {i}" for i in range(6)], "shard_size": 4},
        "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
        "generation": {"seeds": [1, 2], "max_new_tokens": 8},
    }
    data.update(over)
    return parse_spec(data)


def test_the_default_engine_keeps_ids_and_cells():
    quick = load_spec(QUICKSTART)
    assert plan(quick)[0].sweep_id == "cb3dce6badd617dc"
    explicit = quick.model_copy(update={"engines": parse_spec(_with(engines=[{"name": "decodebench"}])).engines})
    assert plan(explicit)[0].sweep_id == "cb3dce6badd617dc"
    old, new = plan(spec()), plan(spec(engines=[{"name": "decodebench"}]))
    assert [(j.job_id, j.cell) for j in old] == [(j.job_id, j.cell) for j in new]
    assert all(j.engine is None for j in new)


def _with(**over):
    return {
        "name": "q",
        "models": [{"path": "m"}],
        "prompts": {"inline": ["x"]},
        "strategies": [{"name": "greedy"}],
    } | over


def test_a_second_engine_adds_its_own_cells_and_keeps_the_own_ones():
    old = plan(spec())
    both = plan(spec(engines=[{"name": "decodebench"}, {"name": "vllm", "dtype": "float32", "max_model_len": 256}]))
    assert both[0].sweep_id != old[0].sweep_id
    cells = sorted({j.cell for j in both})
    top_p = "top_p(p=0.9,temperature=1.0)"
    assert cells == sorted(["model-a::greedy", "model-a::greedy::vllm", f"model-a::{top_p}", f"model-a::{top_p}::vllm"])
    vllm_jobs = [j for j in both if j.engine is not None]
    assert vllm_jobs and all(j.engine.name == "vllm" and j.engine.max_model_len == 256 for j in vllm_jobs)
    assert len({j.job_id for j in both}) == len(both)
    labelled = plan(spec(engines=[{"name": "vllm", "label": "vllm-bf16", "dtype": "bfloat16"}]))
    assert {j.cell.split("::")[-1] for j in labelled} == {"vllm-bf16"}


@pytest.mark.parametrize(
    ("engines", "needle"),
    [
        ([{"name": "tgi"}], "tgi"),
        ([{"name": "vllm", "swap_space": 4}], "swap_space"),
        ([{"name": "decodebench", "dtype": "float32"}], "dtype"),
        ([{"name": "vllm"}, {"name": "vllm"}], "share the label vllm"),
        ([{"name": "vllm", "max_model_len": 0}], "max_model_len"),
    ],
)
def test_bad_engine_input_is_one_line(engines, needle):
    with pytest.raises(UsageError) as err:
        parse_spec(_with(engines=engines))
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("strategy", "params"),
    [("contrastive", {}), ("diverse_beam", {})],
)
def test_strategies_vllm_lacks_are_refused_by_name(strategy, params):
    s = spec(strategies=[{"name": strategy, "params": params}], engines=[{"name": "vllm"}])
    jobs = plan(s)
    why = job_refusal(jobs[0], None, Limits())
    assert why == why.splitlines()[0] and f"strategy {strategy} on engine vllm" in why
    with pytest.raises(UsageError, match=f"strategy {strategy} on engine vllm"):
        check_engines(jobs)
    own = plan(spec(strategies=[{"name": strategy, "params": params}]))
    assert job_refusal(own[0], None, Limits()) is None


def test_a_modifier_vllm_lacks_is_refused_and_the_rest_pass():
    jobs = plan(
        spec(strategies=[{"name": "greedy", "params": {"no_repeat_ngram_size": 3}}], engines=[{"name": "vllm"}])
    )
    assert "no_repeat_ngram_size on engine vllm" in job_refusal(jobs[0], None, Limits())
    ok = plan(spec(strategies=[{"name": "min_p", "params": {"repetition_penalty": 1.2}}], engines=[{"name": "vllm"}]))
    assert job_refusal(ok[0], None, Limits()) is None


def test_a_temperature_past_vllms_range_is_refused_on_vllm_only():
    """vllm.SamplingParams refuses temperature > 2 when the job runs; the sweep is refused at validation, in one
    line naming the variant, and the own engine takes the same temperature (the task sweep's grid reaches 4)."""
    hot = [{"name": "min_p", "params": {"p": 0.1, "temperature": [2.0, 4.0]}}]
    jobs = plan(spec(strategies=hot, engines=[{"name": "vllm"}]))
    mild = next(j for j in jobs if j.strategy.params["temperature"] == 2.0)
    too_hot = next(j for j in jobs if j.strategy.params["temperature"] == 4.0)
    assert job_refusal(mild, None, Limits()) is None
    why = job_refusal(too_hot, None, Limits())
    assert (
        why == "refused: min_p with temperature 4.0 on engine vllm: vLLM's SamplingParams takes temperature in"
        " [0.01, 2] (it samples a lower one at 0.01)"
    )
    with pytest.raises(UsageError, match="temperature 4.0 on engine vllm"):
        check_engines([mild, too_hot])
    assert all(job_refusal(j, None, Limits()) is None for j in plan(spec(strategies=hot)))


def test_a_temperature_vllm_would_raise_to_its_floor_is_refused_on_vllm_only():
    """vllm.SamplingParams runs a temperature in (0, 0.01) at 0.01 (a log line, no error): the vLLM cell would
    sample another distribution than the own engine's cell of the same variant. Refused there, in one line."""
    cold = [{"name": "top_k", "params": {"k": 5, "temperature": [0.01, 0.001]}}]
    jobs = plan(spec(strategies=cold, engines=[{"name": "vllm"}]))
    floor = next(j for j in jobs if j.strategy.params["temperature"] == 0.01)
    too_cold = next(j for j in jobs if j.strategy.params["temperature"] == 0.001)
    assert job_refusal(floor, None, Limits()) is None
    assert job_refusal(too_cold, None, Limits()) == (
        "refused: top_k with temperature 0.001 on engine vllm: vLLM's SamplingParams takes temperature in"
        " [0.01, 2] (it samples a lower one at 0.01)"
    )
    with pytest.raises(UsageError, match="temperature 0.001 on engine vllm"):
        check_engines([floor, too_cold])
    assert all(job_refusal(j, None, Limits()) is None for j in plan(spec(strategies=cold)))
    assert job_refusal(plan(spec(engines=[{"name": "vllm"}]))[0], None, Limits()) is None  # greedy: no temperature


def test_vllm_not_installed_fails_with_how_to_install(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="setup-vllm.sh"):
        check_engines(plan(spec(engines=[{"name": "vllm"}])))


def test_greedy_agreement_between_engines_per_cell():
    from controller.report.compute.engines import add_agreement, has_engines
    from worker.core.results import GenerationRecord

    def rec(cell, prompt, ids):
        return GenerationRecord(
            job_id="j", cell=cell, model="m", strategy="greedy", params={}, seed=0, job_seed=0, prompt_id=prompt,
            prompt="p", text="t", token_ids=ids, n_new_tokens=len(ids), stop_reason="length", batch=0,
        )  # fmt: skip

    records = {
        "m::greedy": [rec("m::greedy", "a", [1, 2]), rec("m::greedy", "b", [3, 4])],
        "m::greedy::vllm": [rec("m::greedy::vllm", "a", [1, 2]), rec("m::greedy::vllm", "b", [3, 5])],
    }
    rows = [
        {"cell": "m::greedy", "strategy": "greedy", "engine": "decodebench"},
        {"cell": "m::greedy::vllm", "strategy": "greedy", "engine": "vllm"},
    ]
    assert has_engines(rows) and not has_engines(rows[:1])
    add_agreement(rows, records)
    assert rows[1]["engine_agreement"] == 0.5 and "engine_agreement" not in rows[0]


def test_engine_agreement_compares_each_sample_with_the_same_sample():
    from controller.report.compute.engines import token_agreement
    from worker.core.results import GenerationRecord

    def rec(cell, sample, ids):
        return GenerationRecord(
            job_id="j", cell=cell, model="m", strategy="greedy", params={}, seed=0, job_seed=0, prompt_id="a",
            prompt="p", text="t", token_ids=ids, n_new_tokens=len(ids), stop_reason="length", batch=0, sample=sample,
        )  # fmt: skip

    # two samples of one prompt and seed, each the same on both engines (before: each compared with the last, 0.5)
    own = [rec("m::greedy", 0, [1, 2]), rec("m::greedy", 1, [3, 4])]
    other = [rec("m::greedy::vllm", 0, [1, 2]), rec("m::greedy::vllm", 1, [3, 4])]
    assert token_agreement(other, own) == 1.0
    assert token_agreement(other, own[:1]) == 1.0  # a sample the other cell does not have is not compared


def test_the_distribution_checks_p_value_is_the_lowest_seeds_and_empty_without_one():
    from types import SimpleNamespace

    from controller.report.compute.engines import gtest_p

    def result(seed, check):
        return SimpleNamespace(job=SimpleNamespace(seed=seed), engine={"distribution_check": check} if check else {})

    assert gtest_p([result(2, {"p_value": 0.9}), result(1, {"p_value": 0.3}), result(0, None)]) == 0.3
    assert gtest_p([result(1, None)]) is None and gtest_p([]) is None


@pytest.mark.slow
def test_a_vllm_job_on_a_worker_without_vllm_fails_once_with_how_to_install(tmp_path):
    """The dispatch seam in worker.engine.job: a vLLM job reaching the own engine's environment is one
    permanent reason naming the setup script, never an ImportError traceback, and nothing is written."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    pytest.importorskip("torch")  # the own engine's environment
    from tests.support.services import TINY_MODEL
    from worker.core.errors import PermanentJobError
    from worker.engine.job import Runtime, run_job
    from worker.store import open_store

    s = spec(models=[{"path": str(TINY_MODEL)}], engines=[{"name": "vllm"}], strategies=[{"name": "greedy"}])
    job = plan(s)[0]
    store = open_store(f"file://{tmp_path}")
    with pytest.raises(PermanentJobError, match="vLLM is not installed in this worker's environment.*setup-vllm.sh"):
        run_job(job, store=store, runtime=Runtime("cpu"))
    assert not store.job_complete(job.tenant, job.sweep_id, job.job_id)


@pytest.mark.slow
def test_decodebench_run_without_vllm_says_how_to_install_in_one_line(tmp_path):
    import importlib.util

    import yaml
    from click.testing import CliRunner

    from controller.cli import main as cli
    from tests.support.services import TINY_MODEL

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    pytest.importorskip("torch")  # `decodebench run` hosts the own engine
    path = tmp_path / "sweep.yaml"
    sweep = _with(models=[{"path": str(TINY_MODEL)}], engines=[{"name": "vllm", "dtype": "float32"}])
    path.write_text(yaml.safe_dump(sweep))
    r = CliRunner().invoke(cli, ["run", str(path), "--out", str(tmp_path / "runs"), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert "vLLM is not installed in this environment; install it with bash scripts/setup-vllm.sh" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("params", "generation", "what"),
    [
        ({"early_stopping": True}, {}, "early_stopping"),
        ({"repetition_penalty": 1.2}, {}, "repetition_penalty"),
        ({}, {"stop": ["."]}, "stop strings"),
        ({}, {"min_new_tokens": 2}, "min_new_tokens"),
    ],
)
def test_beam_on_vllm_is_refused_where_its_beam_search_differs(params, generation, what):
    gen = {"seeds": [1], "max_new_tokens": 8, **generation}
    beam = [{"name": "beam", "params": {"num_beams": 2, **params}}]
    jobs = plan(spec(strategies=beam, engines=[{"name": "vllm"}], generation=gen))
    assert f"refused: beam with {what} on engine vllm" in job_refusal(jobs[0], None, Limits())
    plain = plan(spec(strategies=[{"name": "beam", "params": {"num_beams": 2}}], engines=[{"name": "vllm"}]))
    assert job_refusal(plain[0], None, Limits()) is None


def test_max_model_len_beyond_the_model_is_one_line_at_validation():
    from controller.sweep.context import check_context
    from tests.support.services import TINY_MODEL

    def jobs(length, max_new=8):
        gen = {"seeds": [1], "max_new_tokens": max_new}
        engines = [{"name": "vllm", "max_model_len": length}]
        return plan(spec(models=[{"path": str(TINY_MODEL)}], engines=engines, generation=gen))

    with pytest.raises(UsageError, match="max_model_len 1024 is beyond model austen-tiny's 256 positions"):
        check_context(jobs(1024))
    with pytest.raises(UsageError, match=r"engines.max_model_len: model 'austen-tiny \(max_model_len\)' takes 16"):
        check_context(jobs(16, max_new=12))
    check_context(jobs(256))
