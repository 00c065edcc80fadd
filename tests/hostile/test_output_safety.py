"""Output that cannot be turned against its reader (issue 28, item 5).

The payloads a hostile teammate would put in a sweep, a model name, a prompt or a reference:
spreadsheet formulas in every CSV that decodebench writes (rating sheets, summary.csv), terminal
escape sequences (clear screen, window title, OSC 8 links) in everything printed to a terminal,
and raw HTML in summary.md. Each is neutralised by one function of `worker.core.safetext`.
"""

from __future__ import annotations

import csv
import io
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.report.compute.aggregate import summarize
from controller.report.ratings.sheets import sheet_csv
from controller.report.render.write import csv_bytes, write_reports
from tests.support.report import make_sweep, write_sweep
from tests.support.services import PROMPTS, TINY_MODEL
from worker.core.safetext import csv_cell, markdown, terminal
from worker.store import FileStore

CSI = "\x1b[2J"  # clear screen
TITLE = "\x1b]0;pwned\x07"  # window title
LINK = "\x1b]8;;http://evil.example\x1b\\click me\x1b]8;;\x1b\\"  # OSC 8 hyperlink
ESCAPES = CSI + TITLE + LINK
FORMULAS = ['=HYPERLINK("http://evil.example","x")', "+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0", "-2+3"]
IMG = "<img src=x onerror=alert(1)>"


def no_escape(text: str) -> None:
    """Nothing a terminal would interpret: no ESC, BEL or CR, and the payload is shown instead."""
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text, repr(text)


# -- the three functions ------------------------------------------------------------------


def test_terminal_shows_every_escape_sequence_instead_of_running_it():
    assert terminal(ESCAPES) == (
        "\\x1b[2J\\x1b]0;pwned\\x07\\x1b]8;;http://evil.example\\x1b\\click me\\x1b]8;;\\x1b\\"
    )
    assert terminal("a\nb\rc\td\x9b\u202eevil\u200b") == "a\\nb\\rc\\td\\x9b\\u202eevil\\u200b"
    assert terminal("café 日本 ok - = <b>") == "café 日本 ok - = <b>"  # printable text is unchanged


@pytest.mark.parametrize("payload", [*FORMULAS, "\tx", "\rx"])
def test_csv_cell_neutralises_text_that_a_spreadsheet_would_evaluate(payload):
    assert csv_cell(payload) == "'" + payload


def test_csv_cell_leaves_numbers_and_plain_text_alone():
    assert csv_cell(-0.5) == -0.5 and csv_cell(-3) == -3 and csv_cell(None) is None
    assert csv_cell("plain text") == "plain text" and csv_cell("a=b") == "a=b"
    frame = pd.DataFrame({"model": ["=1+1", "ok"], "delta": [-0.5, 2.0], "n": [-1, 3]})
    rows = list(csv.reader(io.StringIO(csv_bytes(frame).decode())))
    assert rows[1] == ["'=1+1", "-0.5", "-1"] and rows[2] == ["ok", "2.0", "3"]


def test_markdown_escapes_html_pipes_newlines_and_escapes():
    assert markdown(IMG + "|x\ny" + CSI) == "&lt;img src=x onerror=alert(1)&gt;\\|x y\\x1b[2J"
    assert markdown("a & b") == "a &amp; b"


# -- every writer --------------------------------------------------------------------------


def hostile_sweep():
    """A synthetic sweep whose model names are formulas and HTML, and whose name holds escape sequences."""
    cells = [(FORMULAS[0].replace("/", ""), "greedy", {}), ("@SUM(1+1)" + IMG.replace("/", ""), "greedy", {})]
    data = make_sweep(n_prompts=4, cells=cells)
    data.spec["name"] = "evil" + ESCAPES + IMG
    prompt = FORMULAS[1]
    data.generations = [g.model_copy(update={"prompt": prompt, "text": FORMULAS[2]}) for g in data.generations]
    return data


def test_summary_csv_and_md_are_safe(tmp_path):
    data = hostile_sweep()
    summary = summarize(data, n_boot=0)
    store = FileStore(tmp_path)
    keys = write_reports(store, data.tenant, data.sweep_id, summary, data, formats=("csv", "md"))
    rows = list(csv.DictReader(io.StringIO(store.read_bytes(keys["csv"]).decode())))
    models = {r["model"] for r in rows} - {""}
    assert models == {"'" + FORMULAS[0].replace("/", ""), "'@SUM(1+1)" + IMG.replace("/", "")}
    for row in rows:
        for value in row.values():
            assert not value.startswith(("=", "+", "@")), value
    back = pd.read_csv(io.BytesIO(store.read_bytes(keys["csv"])))
    assert pd.api.types.is_numeric_dtype(back["tokens_per_s"])  # numbers the project wrote stay numbers
    md = store.read_bytes(keys["md"]).decode()
    assert "<img" not in md and "&lt;img src=x onerror=alert(1)&gt;" in md
    no_escape(md)
    assert "evil\\x1b[2J" in md


def test_rating_sheet_csv_neutralises_prompt_text_and_reference():
    items = [{"item": "i0000000001", "prompt": p, "text": t} for p, t in zip(FORMULAS, reversed(FORMULAS))]
    rows = list(csv.reader(io.StringIO(sheet_csv("r1", items, ["fluency"]).decode())))
    for row in rows[1:]:
        assert row[2].startswith("'") and row[3].startswith("'"), row
        assert row[0] == "i0000000001" and row[1] == "r1"


def test_exported_sheets_on_disk_are_safe(tmp_path):
    store = FileStore(tmp_path / "store")
    data = hostile_sweep()
    data.prompts[0] = data.prompts[0].model_copy(update={"reference": FORMULAS[3]})
    write_sweep(store, data)
    out = tmp_path / "sheets"
    res = CliRunner().invoke(main, ["rate", "export", data.sweep_id, "--items", "4", "--raters", "1",
                                    "--out", str(out), "--store", store.url])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((out / "sheet-r1.csv").open()))
    texts = {r["text"] for r in rows} | {r["prompt"] for r in rows}
    assert all(not t.startswith(("=", "+", "-", "@")) for t in texts), texts
    assert "'" + FORMULAS[2] in texts
    page = (out / "sheet-r1.html").read_text()
    assert "<img" not in page.split('id="sheet">', 1)[1].split("</script>", 1)[0]  # the data stays data


def test_report_md_on_the_terminal_shows_escapes(tmp_path):
    store = FileStore(tmp_path)
    data = hostile_sweep()
    write_sweep(store, data)
    res = CliRunner().invoke(main, ["report", data.sweep_id, "--store", store.url, "--n-boot", "0"])
    assert res.exit_code == 0, res.output
    no_escape(res.output)
    assert "&lt;img" in res.output and "<img" not in res.output


# -- the terminal: run, status, errors ----------------------------------------------------

SPEC = """
name: "evil\\e[2J\\e]0;pwned\\a\\e]8;;http://evil.example\\e\\\\click\\e]8;;\\e\\\\"
models:
  - path: {model}
    name: "tiny\\e[2J<img src=x onerror=alert(1)>"
prompts:
  path: {prompts}
  limit: 2
strategies:
  - name: greedy
generation:
  max_new_tokens: 4
  warmup: false
"""


@pytest.fixture()
def hostile_spec(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(SPEC.format(model=TINY_MODEL, prompts=PROMPTS))
    return path


def test_validate_and_run_print_names_with_their_escapes_visible(tmp_path, hostile_spec):
    res = CliRunner().invoke(main, ["validate", str(hostile_spec)])
    assert res.exit_code == 0, res.output
    no_escape(res.output)
    assert "tiny\\x1b[2J<img" in res.output
    res = CliRunner().invoke(main, ["--log-level", "info", "run", str(hostile_spec), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    no_escape(res.output)  # the table, the summary line and the console log lines
    assert "tiny\\x1b[2J&lt;img" in res.output
    (md,) = (tmp_path / "r").glob("default/sweeps/*/report/summary.md")
    assert "<img" not in md.read_text() and "\x1b" not in md.read_text()


def test_status_prints_names_cells_and_failure_reasons_with_escapes_visible(tmp_path, hostile_spec, redis_url):
    from controller.sweep.load import load_spec
    from controller.sweep.plan import plan
    from worker.core.contract import JobStatus
    from worker.sweepstate import transition

    store = str(tmp_path / "runs")
    res = CliRunner().invoke(main, ["submit", str(hostile_spec), "--redis-url", redis_url, "--store", store])
    assert res.exit_code == 0, res.output
    (job,) = plan(load_spec(hostile_spec), "default")
    import redis

    conn = redis.Redis.from_url(redis_url)
    transition(conn, "default", job.sweep_id, job.job_id, job.cell, JobStatus.RUNNING)
    transition(conn, "default", job.sweep_id, job.job_id, job.cell, JobStatus.FAILED, reason="boom " + ESCAPES)
    res = CliRunner().invoke(main, ["status", job.sweep_id, "--redis-url", redis_url])
    assert res.exit_code == 1, res.output  # a finished sweep with a failed job: status says so and exits 1
    no_escape(res.output)
    assert "evil\\x1b[2J" in res.output and "tiny\\x1b[2J" in res.output
    assert "boom \\x1b[2J\\x1b]0;pwned\\x07" in res.output
    as_json = CliRunner().invoke(main, ["status", job.sweep_id, "--json", "--redis-url", redis_url])
    assert json.loads(as_json.output)["name"].startswith("evil\x1b[2J")  # JSON keeps the value, escaped by JSON


def test_an_error_line_shows_escapes(tmp_path):
    res = CliRunner().invoke(main, ["report", "nosuch" + CSI, "--store", str(tmp_path)])
    assert res.exit_code != 0
    no_escape(res.output)
    assert "\\x1b[2J" in res.output, res.output


def test_logs_lines_show_escapes(tmp_path):
    from worker.core import paths

    store = FileStore(tmp_path)
    key = paths.log_key("default", "s1", "j1")
    store.write_jsonl(key, [{"timestamp": "t", "level": "error", "event": "job.failed", "error": "boom " + ESCAPES}])
    res = CliRunner().invoke(main, ["logs", "j1", "--sweep", "s1", "--store", store.url])
    assert res.exit_code == 0, res.output
    no_escape(res.output)
    assert "boom \\x1b[2J" in res.output
