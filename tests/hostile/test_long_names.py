"""Long names and paths (issue 28, item 7): a 5,000-character sweep id, job id, store path or
output path is one line on stderr and exit 2, never an OSError traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from controller.cli import main
from tests.support.cli import refused
from tests.support.report import make_sweep, write_sweep
from worker.store import FileStore

LONG = "a" * 5000


@pytest.fixture()
def store(tmp_path):
    store = FileStore(tmp_path / "runs")
    data = make_sweep(n_prompts=2)
    write_sweep(store, data)
    return store, data.sweep_id, tmp_path


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.pure
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["report", LONG], "is not a sweep id"),
        (["rate", "export", LONG, "--items", "2", "--raters", "1"], "is not a sweep id"),
        (["rate", "import", LONG, "{sheet}"], "is not a sweep id"),
        (["logs", LONG, "--sweep", "{sweep}"], "is not a job id"),
        (["logs", "j1", "--sweep", LONG], "is not a sweep id"),
        (["report", "{sweep}", "--output", "{tmp}/" + LONG + "/x.md"], "File name too long"),
        (["rate", "export", "{sweep}", "--items", "2", "--raters", "1", "--out", "{tmp}/" + LONG], "too long"),
    ],
    ids=["report-id", "export-id", "import-id", "logs-job", "logs-sweep", "report-out", "export-out"],
)
def test_long_ids_and_output_paths_are_one_line(store, argv, expected):
    st, sweep, tmp = store
    sheet = tmp / "sheet.csv"
    sheet.write_text("item,rater,prompt,text\n")
    argv = [a.format(sweep=sweep, tmp=tmp, sheet=sheet) for a in argv] + ["--store", st.url]
    line = refused(invoke(*argv), expected)
    assert LONG not in line


@pytest.mark.pure
@pytest.mark.parametrize("prefix", ["", "file://", "s3://bucket/"])
def test_a_long_store_path_is_one_line(store, prefix):
    _, sweep, tmp = store
    refused(invoke("report", sweep, "--store", f"{prefix}{tmp}/{LONG}"), "too long")


@pytest.mark.pure
def test_run_with_a_long_out_is_refused_before_any_job(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\nmodels: [{path: gpt2}]\nprompts: {inline: [a]}\nstrategies: [{name: greedy}]\n")
    refused(invoke("run", str(spec), "--out", str(tmp_path / LONG)), "too long")


def test_status_of_a_long_sweep_id_is_one_line(redis_url):
    refused(invoke("status", LONG, "--redis-url", redis_url), "is not a sweep id")
    refused(invoke("cancel", LONG, "--redis-url", redis_url), "is not a sweep id")
