"""click's own usage errors (issue 14): an unknown option or command, a missing argument, a bad
value, for `decodebench` (its commands and sub-groups included) and `decodebench-worker`, are one
line on stderr, `error: ...`, and exit 2; `--help` stays click's."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from controller.cli import main
from worker.cli import main as worker_main

pytestmark = pytest.mark.pure


def one_line_usage_error(result, *expected: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Usage:" not in lines[0], result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--bogus"], ["No such option '--bogus'", "(see 'decodebench --help')"]),
        (["nosuchcommand"], ["No such command 'nosuchcommand'"]),
        (["report"], ["Missing argument 'SWEEP'", "(see 'decodebench report --help')"]),
        (["report", "x", "--n-boot", "abc"], ["Invalid value for '--n-boot'"]),
        (["report", "x", "--format", "zzz"], ["Invalid value for '--format'", "'zzz' is not one of"]),
        (["validate", "a.yaml", "--nope"], ["No such option '--nope'"]),
        (["status", "abc", "--interval", "soon"], ["Invalid value for '--interval'"]),
        (["status", "abc", "--watch", "--interval", "-1"], ["Invalid value for '--interval'", ">=0.5"]),
        (["status", "abc", "--watch", "--interval", "0"], ["Invalid value for '--interval'"]),
        (["status", "abc", "--watch", "--interval", "nan"], ["Invalid value for '--interval'"]),
        (["report", "x", "--distributed", "--wait-s", "nan"], ["Invalid value for '--wait-s'", "not a finite"]),
        (["report-worker", "--max-jobs", "-1"], ["Invalid value for '--max-jobs'", ">=1"]),
        (["tenants", "nosuch"], ["No such command 'nosuch'", "decodebench tenants --help"]),
        (["cluster", "scale"], ["decodebench cluster scale --help"]),
    ],
)
def test_a_usage_error_of_decodebench_is_one_line_and_exit_2(argv, expected):
    one_line_usage_error(CliRunner().invoke(main, argv, prog_name="decodebench"), *expected)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--bogus"], ["No such option '--bogus'", "(see 'decodebench-worker --help')"]),
        (["--max-jobs", "many"], ["Invalid value for '--max-jobs'"]),
        (["--max-jobs", "0"], ["Invalid value for '--max-jobs'", ">=1"]),  # 0 and -1 ran one job, then left
        (["--log-format", "xml"], ["Invalid value for '--log-format'"]),
    ],
)
def test_a_usage_error_of_the_worker_is_one_line_and_exit_2(argv, expected):
    one_line_usage_error(CliRunner().invoke(worker_main, argv, prog_name="decodebench-worker"), *expected)


@pytest.mark.parametrize(
    "command, argv",
    [(main, ["--help"]), (main, ["report", "--help"]), (main, ["tenants", "--help"]), (worker_main, ["--help"])],
)
def test_help_is_clicks_own(command, argv):
    result = CliRunner().invoke(command, argv, prog_name="prog")
    assert result.exit_code == 0 and result.stdout.startswith("Usage: prog") and "Options:" in result.stdout
    assert result.stderr == ""


def test_decodebench_without_a_command_still_shows_its_help():
    result = CliRunner().invoke(main, [], prog_name="decodebench")
    assert result.exit_code == 2 and "Usage: decodebench" in result.output and "Commands:" in result.output
