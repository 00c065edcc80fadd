"""report.html as a still picture (issue 42, item 4), in headless Chromium: at 50 variants no two legend
entries of the quality-vs-speed panel share colour and symbol (read from the drawn SVG); printed, every
chart takes the page's width, and neither the toolbar nor a screen-only hint prints; a column empty for
the whole sweep (joules, NVML on a CPU) is left out; the table's first screen shows quality columns."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from controller.report.compute.aggregate import summarize
from controller.report.render.html import render_html
from controller.report.render.labels import varying_params
from controller.report.render.plots import encoding
from tests.support.browser import browse, poppler
from tests.support.report import make_sweep

VARIANTS = (
    [("top_p", {"p": p}) for p in (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.92, 0.94, 0.96, 0.98)]
    + [("top_k", {"k": k}) for k in (2, 5, 10, 20, 30, 40, 50, 60, 80, 100, 200, 400, 1000)]
    + [("min_p", {"min_p": m}) for m in (0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6)]
    + [("typical", {"typical_p": t}) for t in (0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.92, 0.95, 0.97, 0.99)]
    + [("greedy", {}), ("beam", {"num_beams": 4})]
)
CELLS = [("austen-tiny", s, p) for s, p in VARIANTS]

PROBE = """<script>setTimeout(function(){
 var out={legend:[],first:[],widths:{}};
 document.querySelectorAll('#chart-quality-speed .legend .traces').forEach(function(t){
  var p=t.querySelector('.legendpoints path');if(!p)return;var s=getComputedStyle(p);
  out.legend.push([t.textContent,p.getAttribute('d'),s.fill,s.stroke]);});
 document.querySelectorAll('#summary-table thead tr:last-child th').forEach(function(th){
  if(th.getBoundingClientRect().right<=window.innerWidth)out.first.push(th.dataset.col);});
 window.dispatchEvent(new Event('beforeprint'));
 setTimeout(function(){document.querySelectorAll('.js-plotly-plot').forEach(function(d){
   out.widths[d.id]=d.querySelector('.main-svg').getAttribute('width');});
  var pre=document.createElement('pre');pre.id='probe';pre.textContent=JSON.stringify(out);
  document.body.appendChild(pre);},1500);}, 3000);
</script></body>"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    data = make_sweep(seeds=(0, 1), n_prompts=4, shard_size=4, cells=CELLS)
    summary = summarize(data, n_boot=20, n_boot_corpus=5)
    path = tmp_path_factory.mktemp("still") / "report.html"
    path.write_text(render_html(summary, data))
    return path, summary


@pytest.mark.pure
@pytest.mark.parametrize("n", [10, 50, 400])
def test_every_variant_has_its_own_mark(n):
    """Two strategies' grids of n/2 variants each: n marks, no two with the same symbol and colour."""
    grids = [(s, i) for s in ("top_p", "top_k") for i in range(n // 2)]
    rows = [{"model": "m", "strategy": s, "params": json.dumps({"x": i})} for s, i in grids]
    cells = pd.DataFrame(rows)
    marks = encoding(cells, varying_params(cells))
    assert len(marks) == n
    assert len({(m["symbol"], m["color"]) for m in marks.values()}) == n
    first = [marks[label]["symbol"] for label in list(marks)[: min(10, n // 2)]]
    assert len(set(first)) == 1  # a strategy's first ten variants share its symbol: colour tells them apart


def test_no_two_legend_entries_look_alike_at_50_variants(page, tmp_path):
    path, _ = page
    probed = tmp_path / "probed.html"
    probed.write_text(path.read_text().replace("</body>", PROBE))
    proc = browse(tmp_path, probed.as_uri(), "--window-size=1280,900", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S).group(1).replace("&quot;", '"'))
    variants = [entry for entry in found["legend"] if entry[0] not in ("Pareto front", "reference")]
    assert len(variants) == 50
    looks = [tuple(entry[1:]) for entry in variants]
    assert len(set(looks)) == 50, [v for v in variants if looks.count(tuple(v[1:])) > 1][:4]
    # the table's first screen (1280 px) shows quality columns, not only the cell, speed and sample size
    assert {"diversity", "perplexity"} & set(found["first"]), found["first"]
    # printing: every chart redrawn at the page's width (A4 landscape less margins), the grid two to a row
    assert found["widths"]["chart-quality-speed"] == "1040"
    assert found["widths"]["chart-tokens_per_s"] == str(1040 // 2 - 8)


def test_the_printout_has_no_toolbar_hints_or_empty_columns(page, tmp_path):
    path, summary = page
    html = path.read_text()
    empty = [c for c in summary.columns if "_ci_" not in c and summary[c].isna().all()]
    assert "joules_per_token" in empty  # a CPU sweep: no energy reading
    for c in empty:
        assert f'data-col="{c}"' not in html and f">{c.replace('_', '_<wbr>')}</th>" not in html, c
    printed_css = html.split("@media print{", 1)[1].split("\n}", 1)[0]
    assert re.search(r"\.modebar-container[^{]*\{display:none\}", printed_css)  # plotly's toolbar
    pdf = tmp_path / "report.pdf"
    proc = browse(tmp_path, path.as_uri(), f"--print-to-pdf={pdf}", "--no-pdf-header-footer")
    assert proc.returncode == 0 and pdf.read_bytes()[:5] == b"%PDF-", proc.stderr[-2000:]
    text = " ".join(poppler("pdftotext", pdf).split())
    assert "Quality vs speed" in text and "does not apply" in text
    for hint in ("Click a header", "Hover a", "click a legend", "hover a point"):
        assert hint not in text, hint
