"""Every report format for every sweep shape the docs show (issue 42, item 0): two engines side by side,
human ratings, references or none, one model or several, a single cell, a failed cell. Each shape is
written to a store as workers write it, then `decodebench report` renders every format through the CLI,
and report.html is opened in headless Chromium: no script error, every chart drawn.

The two-engine sweep is the one that crashed (`ValueError: could not convert string to float:
'decodebench'`: the `engine` column taken for a metric)."""

from __future__ import annotations

import io
import json
import re

import pandas as pd
import pytest
from click.testing import CliRunner

from controller.cli import main
from tests.support.browser import browse
from tests.support.report import make_sweep, write_sweep
from worker.core import paths
from worker.store import FileStore

ENGINE_CELLS = [
    (model, s, p)
    for model in ("austen-tiny", "austen-small")
    for s, p in (("greedy", {}), ("beam", {"num_beams": 2}), ("top_p", {"p": 0.9}), ("top_k", {"k": 20}))
]
ONE_MODEL = [("austen-tiny", "greedy", {}), ("austen-tiny", "top_p", {"p": 0.9})]
TWO_MODELS = ONE_MODEL + [("austen-small", "greedy", {}), ("austen-small", "top_p", {"p": 0.9})]
# The sweep of one model and two strategies is the rated one: unrated, it was a shape of its own, a report
# and a browser run more that drew nothing the rated shape and the unrated ones of several models do not.
SHAPES = {
    "engines": {"cells": ENGINE_CELLS, "engines": ("decodebench", "vllm")},
    "several-models": {"cells": TWO_MODELS, "seeds": (0, 1)},
    "no-references": {"cells": TWO_MODELS, "with_references": False},
    "single-cell": {"cells": [("austen-tiny", "greedy", {})]},
    "failed-cell": {"cells": TWO_MODELS, "failed": "austen-small::top_p(p=0.9)"},
    "one-model-rated": {"cells": ONE_MODEL, "ratings": True},
}


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _rate(store: FileStore, sweep_id: str, tmp_path) -> None:
    """Blinded sheets exported, filled by three raters, imported: the report's rating columns."""
    from tests.support.ratings import export, fill

    data = type("D", (), {"tenant": "default", "sweep_id": sweep_id})
    export(store, data, tmp_path / "sheets", items=4, raters=3, seed=1)
    filled = []
    for n in (1, 2, 3):
        sheet = tmp_path / "sheets" / f"sheet-r{n}.csv"
        out = tmp_path / f"filled-r{n}.csv"
        out.write_bytes(fill(sheet, f"r{n}"))
        filled.append(str(out))
    res = _cli("rate", "import", sweep_id, *filled, "--store", store.url)
    assert res.exit_code == 0, res.output


def write_shape(tmp_path, name: str) -> tuple[FileStore, str]:
    shape = dict(SHAPES[name])
    failed, rated = shape.pop("failed", None), shape.pop("ratings", False)
    data = make_sweep(n_prompts=6, **shape)
    store = FileStore(tmp_path / "store")
    if failed:  # the cell's jobs are planned but none wrote a result (every one failed)
        planned = [{"job_id": r.job.job_id, "cell": r.job.cell} for r in data.results]
        data.results = [r for r in data.results if r.job.cell != failed]
        data.generations = [g for g in data.generations if g.cell != failed]
        store.write_json(paths.plan_key(data.tenant, data.sweep_id), {"jobs": planned})
    write_sweep(store, data)
    if rated:
        _rate(store, data.sweep_id, tmp_path)
    return store, data.sweep_id


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_format_renders_for_every_sweep_shape(tmp_path, name):
    store, sweep_id = write_shape(tmp_path, name)
    # every format under report/; the cells inline (the process pool gives the same figures: test_report_scale)
    res = _cli("report", sweep_id, "--store", store.url, "--n-boot", "20", "--workers", "1")
    assert res.exit_code == 0, res.output
    outputs = {
        fmt: store.read_bytes(paths.report_key("default", sweep_id, name)) for fmt, name in paths.REPORT_FILES.items()
    }
    assert set(outputs) == {"md", "csv", "json", "parquet", "html"}
    csv = pd.read_csv(io.BytesIO(outputs["csv"]))
    parquet = pd.read_parquet(io.BytesIO(outputs["parquet"]))
    assert list(csv.columns) == list(parquet.columns) and len(csv) == len(parquet)
    doc = json.loads(outputs["json"])
    assert len(doc["rows"]) == len(csv) and doc["columns"] == list(csv.columns)
    md = outputs["md"].decode()
    assert "| model" in md
    cells = SHAPES[name]["cells"]
    expected = len(cells) * len(SHAPES[name].get("engines") or [1]) - bool(SHAPES[name].get("failed"))
    assert (csv["strategy"] != "reference").sum() == expected
    if name == "engines":
        assert set(csv["engine"]) >= {"decodebench", "vllm"}
        greedy_vllm = csv[(csv["engine"] == "vllm") & (csv["strategy"] == "greedy")]
        assert list(greedy_vllm["engine_agreement"]) == [1.0, 1.0]  # the same texts on both engines
        assert "@ vllm" in outputs["html"].decode()  # each engine's cells labelled apart in the charts
    if name == "one-model-rated":
        assert any(c.startswith("rating_") or "fluency" in c for c in csv.columns)
    if name == "failed-cell":
        assert "of 6" in md or "of 6" in outputs["html"].decode()  # the complete jobs, of those planned

    page = tmp_path / "report.html"
    page.write_bytes(outputs["html"])
    proc = browse(tmp_path, page.as_uri(), "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    errors = re.search(r'<pre id="js-errors">(.*?)</pre>', proc.stdout, re.S)
    assert errors is not None and errors.group(1) == "", errors and errors.group(1)
    charts = re.findall(r'<div id="(chart-[\w.-]+)" class="chart[^"]*js-plotly-plot', proc.stdout)
    assert "chart-tokens_per_s" in charts
    assert proc.stdout.count('class="main-svg"') >= len(charts)
    if len(cells) > 1:
        assert "chart-quality-speed" in charts
