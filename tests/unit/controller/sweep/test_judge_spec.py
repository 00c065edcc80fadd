"""The sweep spec's `judge:` section and the operator's judge endpoints in the tenants file."""

from __future__ import annotations

import pytest

from controller.sweep.load import parse_spec
from controller.sweep.plan import plan
from worker.core.errors import UsageError
from worker.core.tenants import parse_tenants

BASE = {
    "name": "j",
    "models": [{"path": "gpt2"}],
    "prompts": {"inline": ["a", "b"]},
    "strategies": [{"name": "greedy"}, {"name": "top_p", "params": {"p": 0.9}}],
}


def spec(**judge):
    return parse_spec({**BASE, "judge": judge} if judge else BASE, "sweep")


def refused(match: str, **judge) -> None:
    with pytest.raises(UsageError, match=match) as err:
        spec(**judge)
    assert "\n" not in str(err.value)


def test_a_judge_is_part_of_the_sweep_id_and_a_sweep_without_one_keeps_its_id():
    plain = plan(spec())[0].sweep_id
    assert plan(parse_spec({**BASE, "judge": None}, "sweep"))[0].sweep_id == plain
    judged = plan(spec(url="http://127.0.0.1:8000/v1", model="m"))[0].sweep_id
    single = plan(spec(url="http://127.0.0.1:8000/v1", model="m", mode="single"))[0].sweep_id
    assert len({plain, judged, single}) == 3


def test_the_judges_limits_are_not_part_of_the_sweep_id():
    """What a report may spend is not what the sweep is: raising judge.limits as the budget's error says made a new
    sweep, whose every job ran again. A sweep with the default limits keeps the id it had."""
    judge = {"url": "http://127.0.0.1:8000/v1", "model": "m"}
    default = plan(spec(**judge))[0].sweep_id
    assert plan(spec(**judge, baseline="greedy"))[0].sweep_id == "10ea9d1472fa50a7"  # as a9afecb planned it
    assert plan(spec(**judge, limits={"max_requests": 4, "max_tokens": 10, "concurrency": 1}))[0].sweep_id == default
    assert plan(spec(**judge, limits={"max_requests": 2000}))[0].sweep_id == default


def test_defaults_are_pairwise_at_temperature_zero_with_limits():
    j = spec(endpoint="big-judge", model="m").judge
    assert (j.mode, j.temperature, j.criteria, j.limits.concurrency) == ("pairwise", 0.0, ["overall"], 4)


def test_bad_judges_are_refused_in_one_line_naming_the_field():
    refused("exactly one of `endpoint`, `url` or `local`", model="m")
    refused("exactly one of", endpoint="a", url="http://x/v1", model="m")
    refused("judge.endpoint: .*endpoint name", endpoint="http://evil:80/v1", model="m")
    refused("judge.model", url="http://127.0.0.1:1/v1")
    refused("judge.api_key_env: .*environment variable", url="http://h/v1", model="m", api_key_env="sk-123 abc")
    refused("only with `url`", endpoint="a", model="m", api_key_file="/k")
    refused("judge.mode", url="http://h/v1", model="m", mode="elo")
    refused("judge.limits.concurrency", url="http://h/v1", model="m", limits={"concurrency": 0})
    refused("judge.criteria", url="http://h/v1", model="m", criteria=["Fluency!"])
    refused("judge.limits", url="http://h/v1", model="m", limits={"max_request": 3})  # extra=forbid


def test_a_judge_baseline_naming_no_cell_is_refused_at_plan_time_in_one_line():
    # before: accepted, and the report had no judge section, without a word
    with pytest.raises(UsageError) as err:
        plan(spec(url="http://127.0.0.1:8000/v1", model="m", baseline="gredy"))
    assert str(err.value).startswith("judge.baseline 'gredy': no strategy or cell of this sweep has that name")
    assert "its strategies: greedy, top_p" in str(err.value) and "'gpt2::greedy'" in str(err.value)
    assert "\n" not in str(err.value)
    for named in ("greedy", "top_p", "gpt2::top_p(p=0.9,temperature=1.0)", None):  # strategy, cell key, default
        assert plan(spec(url="http://127.0.0.1:8000/v1", model="m", baseline=named))


def test_decodebench_validate_refuses_a_judge_baseline_naming_no_cell(tmp_path):
    import json

    from click.testing import CliRunner

    from controller.cli import main

    (tmp_path / "s.json").write_text(json.dumps({**BASE, "judge": {"url": "http://h/v1", "model": "m",
                                                                   "baseline": "beam"}}))  # fmt: skip
    out = CliRunner().invoke(main, ["validate", str(tmp_path / "s.json")])
    assert out.exit_code == 2 and "judge.baseline 'beam': no strategy or cell" in out.output


TENANTS = {
    "tenants": [{"name": "team-a", "judges": ["big-judge"]}, {"name": "team-b"}],
    "judges": [{"name": "big-judge", "url": "http://vllm-judge:8000/v1", "api_key_file": "/secrets/judge/key"}],
}


def test_the_operator_declares_judge_endpoints_and_tenants_list_theirs():
    tf = parse_tenants(TENANTS)
    assert tf.judge("big-judge").url == "http://vllm-judge:8000/v1" and tf.judge("nope") is None
    assert tf.get("team-a").judges == ["big-judge"] and tf.get("team-b").judges == []
    bad = {**TENANTS, "tenants": [{"name": "team-a", "judges": ["other"]}]}
    with pytest.raises(UsageError, match=r"tenants\[0\]\.judges: 'other' is not a declared judge endpoint"):
        parse_tenants(bad)
    inline = {**TENANTS, "judges": [{"name": "big-judge", "url": "http://x/v1", "api_key": "sk-1"}]}
    with pytest.raises(UsageError, match="unknown key"):
        parse_tenants(inline)  # a key is referenced (a file, an env var, a Secret), never written inline


def test_the_server_refuses_undeclared_or_unlisted_endpoints_and_urls():
    from controller.server.errors import Forbidden
    from controller.server.service import Context, check_judge

    ctx = Context(conn=None, store=None, signing_key=b"", tenants=parse_tenants(TENANTS), limits=None)
    check_judge(ctx, "team-a", spec(endpoint="big-judge", model="m").judge)  # declared and listed
    check_judge(ctx, "team-a", None)
    cases = [
        ("team-a", {"endpoint": "nope"}, "judge.endpoint: 'nope' is not a judge endpoint declared in the tenants file"),
        ("team-b", {"endpoint": "big-judge"}, "tenant 'team-b' may not use judge endpoint 'big-judge'"),
        ("team-a", {"url": "http://169.254.169.254/v1"}, "judge.url: a sweep submitted to the server names"),
        ("team-a", {"endpoint": "big-judge", "template": "/etc/passwd"}, "judge.template: the server takes no file"),
    ]
    for tenant, where, message in cases:
        with pytest.raises(Forbidden, match=message):
            check_judge(ctx, tenant, spec(model="m", **where).judge)
    bare = Context(conn=None, store=None, signing_key=b"", tenants=None, limits=None)
    with pytest.raises(Forbidden, match="not a judge endpoint declared"):
        check_judge(bare, "default", spec(endpoint="big-judge", model="m").judge)


def test_judge_limits_refuse_an_infinite_time_budget_or_timeout(tmp_path):
    """`time_budget_s: 1e999` reads as infinity: it was taken, and every share of `report --distributed` was then
    refused by its report worker ("the judge job's deadline is not a time"), the budget never spent or checked."""
    from controller.sweep.load import load_spec

    for field in ("time_budget_s", "timeout_s"):
        path = tmp_path / f"{field}.yaml"
        path.write_text(
            "name: j\nmodels: [{path: gpt2}]\nprompts: {inline: [a, b]}\nstrategies: [{name: greedy}]\n"
            f"judge: {{url: 'http://h/v1', model: m, limits: {{{field}: 1e999}}}}\n"
        )
        with pytest.raises(UsageError, match=f"judge.limits.{field}: .*finite") as err:
            load_spec(path)
        assert "\n" not in str(err.value)
        refused(f"judge.limits.{field}", url="http://h/v1", model="m", limits={field: float("inf")})
    assert spec(url="http://h/v1", model="m", limits={"time_budget_s": 1e9}).judge.limits.time_budget_s == 1e9
