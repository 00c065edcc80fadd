"""report.html's encodings for a meeting (issue 28, item 2), read from the page and its figures
without a browser: the quality-vs-speed plot encodes the strategy as the symbol and the variant as
the colour, one legend entry per variant in its strategy's legend, each cell's label on hover and its
variant's beside the point where it fits, one panel per model; the summary table groups its metrics,
keeps the cell's columns sticky (the variant's label, its parameters on hover) and shows intervals on
hover; the printout leaves the example texts out by default above 16 cells, still escaped in the page.
(tests/browser/test_report_print.py checks the same page in headless Chromium.)"""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.report.compute.aggregate import summarize
from controller.report.compute.columns import REFERENCE
from controller.report.render.html import PRINT_SAMPLES_MAX_CELLS, print_samples_default, render_html
from controller.report.render.plots import quality_speed_figure
from controller.report.render.summary_table import summary_table
from tests.support.report import make_sweep, write_sweep
from worker.store import FileStore

pytestmark = pytest.mark.pure

PAYLOAD = "<img src=x onerror=alert(1)>"
VARIANTS = [("greedy", {}), ("beam", {"num_beams": 4})] + [("top_p", {"p": p}) for p in (0.8, 0.9, 0.95)]


def sweep(models=("austen-tiny", "austen-small"), variants=VARIANTS, seeds=(0,)):
    data = make_sweep(seeds=seeds, n_prompts=3, shard_size=3, cells=[(m, s, p) for m in models for s, p in variants])
    return data, summarize(data, n_boot=20, n_boot_corpus=5)


def test_quality_vs_speed_encodes_strategy_variant_and_model():
    _, summary = sweep()
    fig = quality_speed_figure(summary)
    shown = [t for t in fig["data"] if t.get("visible") and t["mode"] == "markers+text"]
    assert len(shown) == 2 * len(VARIANTS)  # one trace per variant in each model's panel
    first = [t for t in shown if t["xaxis"] == "x"]
    symbols = {t["name"]: t["marker"]["symbol"] for t in first}
    colours = {t["name"]: t["marker"]["color"] for t in first}
    assert len(set(colours.values())) == len(VARIANTS)  # every variant its own colour
    assert symbols["top_p(p=0.8)"] == symbols["top_p(p=0.95)"] != symbols["greedy"] != symbols["beam"]
    assert all(t["showlegend"] for t in first) and not any(t["showlegend"] for t in shown if t["xaxis"] != "x")
    assert {t["xaxis"] for t in shown} == {"x", "x2"}  # small multiples: a panel per model
    panels = [a["text"] for a in fig["layout"]["annotations"]]
    assert panels == ["<b>austen-tiny</b>", "<b>austen-small</b>"]
    assert all("%{customdata}" in t["hovertemplate"] for t in shown)  # the cell's label on hover
    assert all(t["customdata"][0].startswith(("austen-tiny · ", "austen-small · ")) for t in shown)
    assert all(t["text"][0] in ("", t["name"]) for t in shown)  # the variant beside its point, where it fits
    assert {t["legend"] for t in first} == {"legend", "legend2", "legend3"}  # a legend per strategy
    assert [fig["layout"][k]["title"]["text"] for k in ("legend", "legend2", "legend3")] == ["greedy", "beam", "top_p"]
    assert fig["layout"]["xaxis"]["range"] == fig["layout"]["xaxis2"]["range"]  # one speed axis


def test_one_model_draws_one_panel():
    _, summary = sweep(models=("austen-tiny",))
    fig = quality_speed_figure(summary)
    assert {t["xaxis"] for t in fig["data"]} == {"x"} and fig["layout"]["annotations"] == []


def test_summary_table_groups_metrics_sticks_the_cell_and_shows_intervals_on_hover():
    _, summary = sweep(seeds=(0, 1))
    page = summary_table(summary)
    screen = page.split('<div class="print-only">')[0]
    groups = re.findall(r'class="g g-(\w+)"', screen)
    assert groups[:4] == ["cell", "quality", "speed", "sample"]  # the quality metrics on the first screen
    sticky = re.findall(r'<th data-col="(\w+)" class="t k">', screen)
    assert sticky == ["model", "strategy"]  # the strategy column: the variant's label
    row = screen.split("<tbody>")[1].split("</tr>")[0]
    assert row.count('class="t k"') == 2  # each row's cell columns sticky too
    assert 'data-col="params"' in screen  # every parameter: among the other columns, and on the label's hover
    assert re.search(r'<td class="t k" data-v="beam" title="num_beams=4">beam</td>', screen)
    assert re.search(r'title="95% CI \[[0-9.]+, [0-9.]+\]">[0-9.]+</td>', row)  # a quality value's interval
    printed = page.split('<div class="print-only">')[1]
    captions = re.findall(r"<caption>(.*?)</caption>", printed)
    assert {"sample", "speed (1)", "quality (1)"} <= set(captions)
    assert all(t.count("<th>") <= 8 for t in printed.split("<caption>")[1:])  # PRINT_COLUMNS per printed table


def test_the_printout_leaves_the_samples_out_above_16_cells_and_the_page_keeps_them_escaped():
    variants = VARIANTS + [("top_k", {"k": k}) for k in (5, 10, 20, 40)]
    data = make_sweep(n_prompts=3, shard_size=3, cells=[(m, s, p) for m in ("tiny", "small") for s, p in variants])
    g = data.generations[0]  # the first cell's first prompt: among the examples
    data.generations[0] = g.model_copy(update={"text": PAYLOAD + " " + g.text})
    summary = summarize(data, n_boot=20, n_boot_corpus=5)
    assert (summary["strategy"] != REFERENCE).sum() == 18 > PRINT_SAMPLES_MAX_CELLS
    assert not print_samples_default(summary)
    assert print_samples_default(summary.iloc[:PRINT_SAMPLES_MAX_CELLS])
    page = render_html(summary, data)
    assert '<body class="print-no-samples">' in page
    assert '<input type="checkbox" id="print-no-samples" checked>' in page
    assert PAYLOAD not in page and "&lt;img src=x onerror=alert(1)&gt;" in page  # still in the page, as text
    both = render_html(summary, data, print_samples=True)
    assert "<body>" in both and '<input type="checkbox" id="print-no-samples">' in both
    assert PAYLOAD not in both
    n = page.split('<div id="samples">')[1].count('<div class="card')
    assert f"{n} example texts left out of this printout" in page


@pytest.mark.parametrize(
    "flag, body, checked",
    [
        ([], "<body>", ""),
        (["--no-print-samples"], '<body class="print-no-samples">', " checked"),
        (["--print-samples"], "<body>", ""),
    ],
)
def test_report_print_samples_flag(tmp_path, flag, body, checked):
    data = make_sweep(n_prompts=2, shard_size=2)  # 4 cells: the printout keeps the samples by default
    write_sweep(FileStore(tmp_path), data)
    out = tmp_path / "r.html"
    argv = ["report", data.sweep_id, "--store", str(tmp_path), "--n-boot", "0", "--format", "html", "-o", str(out)]
    result = CliRunner().invoke(main, argv + flag)
    assert result.exit_code == 0, result.output
    stored = tmp_path / "default/sweeps" / data.sweep_id / "report/report.html"
    for page in (out.read_text(), stored.read_text()):
        assert body in page and f'<input type="checkbox" id="print-no-samples"{checked}>' in page
