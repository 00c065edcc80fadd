"""Settings: one table of DECODEBENCH_* variables, flag > environment > default, shown by --help."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from controller.cli import main
from tests.support.repo import REPO
from worker.cli import main as worker_main
from worker.core import settings
from worker.core.errors import UsageError

pytestmark = pytest.mark.pure

CODE = [p for pkg in ("controller", "worker") for p in (REPO / pkg).rglob("*.py")]
CHART = REPO / "charts" / "decodebench"


def test_every_variable_the_code_or_chart_names_is_in_the_table():
    named = set()
    for path in [*CODE, *CHART.rglob("*.yaml"), *CHART.rglob("*.tpl"), *CHART.rglob("*.sh")]:
        named |= set(re.findall(r"DECODEBENCH_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert named - {s.envvar for s in settings.SETTINGS.values()} == set()


def test_only_the_settings_module_reads_decodebench_variables_from_the_environment():
    readers = [
        str(p.relative_to(REPO)) for p in CODE if re.search(r"environ(\.get)?\(?\[?[\"']DECODEBENCH_", p.read_text())
    ]
    assert readers == []


def test_docs_list_every_setting():
    text = (REPO / "docs" / "settings.md").read_text()
    missing = [s.envvar for s in settings.SETTINGS.values() if f"`{s.envvar}`" not in text]
    assert missing == []


def test_flag_then_environment_then_default(monkeypatch):
    assert settings.get("heartbeat_ttl") == 60.0
    monkeypatch.setenv("DECODEBENCH_HEARTBEAT_TTL", "5")
    assert settings.get("heartbeat_ttl") == 5.0
    assert settings.get("heartbeat_ttl", 2.5) == 2.5
    monkeypatch.setenv("DECODEBENCH_RETRY_INTERVALS", "1,2")
    assert settings.get("retry_intervals") == [1, 2]


def test_a_malformed_variable_is_one_line_naming_it(monkeypatch):
    monkeypatch.setenv("DECODEBENCH_MAX_LOST", "many")
    with pytest.raises(UsageError, match="^DECODEBENCH_MAX_LOST='many': not a valid value"):
        settings.get("max_lost")


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("max_jobs", "-5", "must be 1 or more"),
        ("prompt_line_max_chars", "-1", "must be 1 or more"),
        ("max_num_beams", "0", "must be 1 or more"),
        ("log_level", "bogus", "must be one of debug, info, warning, error, critical"),
    ],
)
def test_a_value_out_of_range_is_one_line_naming_it(monkeypatch, name, value, why):
    """docs/settings.md: a malformed value exits 2. A limit of -5 is not a limit, and an unknown log level is not
    a level: both were taken (the level fell back to info in silence)."""
    var = settings.SETTINGS[name].envvar
    monkeypatch.setenv(var, value)
    with pytest.raises(UsageError, match=f"^{var}={re.escape(repr(value))}: {why}"):
        settings.get(name)


def test_a_log_level_is_taken_in_any_case(monkeypatch):
    monkeypatch.setenv("DECODEBENCH_LOG_LEVEL", "WARNING")
    assert settings.get("log_level") == "warning"


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--log-level", "bogus", "strategies"], {}, "'--log-level'"),
        (["strategies"], {"DECODEBENCH_LOG_LEVEL": "bogus"}, "DECODEBENCH_LOG_LEVEL"),
        (["validate", "examples/quickstart.yaml"], {"DECODEBENCH_MAX_JOBS": "-5"}, "DECODEBENCH_MAX_JOBS='-5'"),
        (
            ["validate", "examples/quickstart.yaml"],
            {"DECODEBENCH_PROMPT_LINE_MAX_CHARS": "-1"},
            "DECODEBENCH_PROMPT_LINE_MAX_CHARS='-1'",
        ),
    ],
)
def test_the_command_line_refuses_them_in_one_line_and_exit_2(argv, env, named):
    result = CliRunner().invoke(main, argv, env=env, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and named in result.stderr


def test_help_shows_each_option_s_variable_and_default():
    out = CliRunner().invoke(main, ["run", "--help"], terminal_width=200).output
    assert "--store" in out and "--out " not in out and "DECODEBENCH_STORE" in out and "default: ./runs" in out
    out = CliRunner().invoke(worker_main, ["--help"], terminal_width=200).output
    for name in (
        "device",
        "queues",
        "redis_url",
        "store",
        "stop_grace",
        "heartbeat_ttl",
        "reaper_interval",
        "log_format",
        "log_level",
    ):
        assert settings.SETTINGS[name].envvar in out, name


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "examples/quickstart.yaml", "--tenant", "team/a"],
        ["run", "examples/quickstart.yaml", "--tenant", "../x"],
        ["status", "abc", "--tenant", "a b"],
        ["report", "abc", "--tenant", ""],
    ],
)
def test_a_bad_tenant_is_one_line_and_exit_2(argv):
    result = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: tenant ")


def test_a_bad_tenant_from_the_environment_too(monkeypatch):
    monkeypatch.setenv("DECODEBENCH_TENANT", "team a")
    result = CliRunner().invoke(main, ["validate", "examples/quickstart.yaml"], catch_exceptions=False)
    assert result.exit_code == 2 and result.output.startswith("error: tenant 'team a'")


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00n\x00a\x00m\x00e", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", b"name: x\xe9\n"]
)
def test_a_binary_or_non_utf8_sweep_file_is_one_line_and_exit_2(tmp_path, content):
    path = tmp_path / "sweep.yaml"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "not UTF-8" in result.output and "Traceback" not in result.output


def test_engine_settings_read_the_cudnn_attention_switch(monkeypatch):
    """Off by default (a plan per new shape, docs/performance.md); DECODEBENCH_SDPA_CUDNN=1 turns it on."""
    pytest.importorskip("torch")  # the engine's settings live with the engine
    from worker.engine.job import EngineSettings

    monkeypatch.delenv("DECODEBENCH_SDPA_CUDNN", raising=False)
    assert EngineSettings.from_environment().sdpa_cudnn is False
    monkeypatch.setenv("DECODEBENCH_SDPA_CUDNN", "1")
    assert EngineSettings.from_environment().sdpa_cudnn is True


@pytest.mark.parametrize(
    ("variable", "value", "least"),
    [("DECODEBENCH_HEARTBEAT_TTL", "-1", 1), ("DECODEBENCH_API_MAX_REQUEST_MB", "-64", 0),
     ("DECODEBENCH_S3_RETRY_S", "nan", 0), ("DECODEBENCH_API_RETRIES", "-2", 0),
     ("DECODEBENCH_SWEEP_TTL_DAYS", "inf", 0)],
)  # fmt: skip
def test_no_number_setting_is_negative_or_not_finite(monkeypatch, variable, value, least):
    """Only some integers had a floor: a heartbeat TTL of -1 made every running job lost at once (requeued, then
    failed), a negative request limit refused every body, NaN passed every comparison."""
    from worker.core.errors import UsageError

    monkeypatch.setenv(variable, value)
    name = variable.removeprefix("DECODEBENCH_").lower()
    with pytest.raises(UsageError, match=rf"^{variable}='{value}': must be {least} or more"):
        settings.get(name)


@pytest.mark.parametrize(("argv", "env"), [(["--reaper-interval", "-5"], {}), (["--reaper-interval", "nan"], {}),
                                           ([], {"DECODEBENCH_STOP_GRACE": "-3"})])  # fmt: skip
def test_a_flags_number_is_held_to_the_same_floor_as_the_environments(argv, env):
    """A float option without a declared floor took -5 and NaN (click's FloatRange with no minimum), from the flag
    and from its variable alike: the worker started with a negative reaper interval."""
    res = CliRunner().invoke(worker_main, [*argv, "--device", "cpu"], env=env)
    assert res.exit_code == 2 and ("not in the range x>=0" in res.output or "not a finite number" in res.output)
