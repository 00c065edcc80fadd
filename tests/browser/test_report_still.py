"""report.html as a still picture (issue 42, item 4), in headless Chromium: at 50 variants no two legend
entries of the quality-vs-speed panel share colour and symbol (read from the drawn SVG), each strategy's
legend is a column of its own below the panel, and the variants' labels are written beside their points
where they fit, never over another label or a point, as the summary table names them; printed, every
chart takes the page's width, and neither the toolbar nor a screen-only hint prints; a column empty for
the whole sweep (joules, NVML on a CPU) is left out; the table's first screen shows quality columns."""

from __future__ import annotations

import html
import json
import re

import pandas as pd
import pytest

from controller.report.compute.aggregate import summarize
from controller.report.render.html import render_html
from controller.report.render.labels import variant_labels
from controller.report.render.marks import encoding
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
 document.querySelectorAll('#chart-quality-speed [class^="legend"] .traces').forEach(function(t){
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
    marks = encoding(list(cells["strategy"]), variant_labels(cells))
    assert len(marks) == n
    assert len({(m["symbol"], m["color"]) for m in marks.values()}) == n
    first = [marks[label]["symbol"] for label in list(marks)[: min(10, n // 2)]]
    assert len(set(first)) == 1  # a strategy's first ten variants share its symbol: colour tells them apart


def probed(path, tmp_path, script: str, name: str) -> dict:
    """What `script` (appended to the page) wrote into <pre id=name>, the page drawn at 1280 px in Chromium."""
    page = tmp_path / f"{name}.html"
    page.write_text(path.read_text().replace("</body>", script))
    proc = browse(tmp_path, page.as_uri(), "--window-size=1280,900", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(html.unescape(re.search(rf'<pre id="{name}">(.*?)</pre>', proc.stdout, re.S).group(1)))


def test_no_two_legend_entries_look_alike_at_50_variants(page, tmp_path):
    path, _ = page
    found = probed(path, tmp_path, PROBE, "probe")
    variants = [entry for entry in found["legend"] if entry[0] not in ("Pareto front", "reference")]
    assert len(variants) == 50
    looks = [tuple(entry[1:]) for entry in variants]
    assert len(set(looks)) == 50, [v for v in variants if looks.count(tuple(v[1:])) > 1][:4]
    # the table's first screen (1280 px) shows quality columns, not only the cell, speed and sample size
    assert {"diversity", "perplexity"} & set(found["first"]), found["first"]
    # printing: every chart redrawn at the page's width (A4 landscape less margins), the grid two to a row
    assert found["widths"]["chart-quality-speed"] == "1040"
    assert found["widths"]["chart-tokens_per_s"] == str(1040 // 2 - 8)


# The quality-vs-speed chart as drawn: plotly's figure data in the page, each legend's entries and each
# written label with its box (px), the points' boxes, the x axis's title and the summary table's labels.
DRAWN = """<script>setTimeout(function(){
 var div=document.getElementById('chart-quality-speed');
 function box(n){if(!n)return null;var r=n.getBoundingClientRect();return [r.left,r.top,r.right,r.bottom];}
 var out={traces:[],legends:{},texts:[],points:[],axis:box(div.querySelector('.xtitle')),
  svg:box(div.querySelector('.main-svg')),table:[]};
 div.data.forEach(function(t){if(t.visible&&/^markers/.test(t.mode))
  out.traces.push([t.name,t.xaxis,t.marker.symbol,t.marker.color]);});
 div.querySelectorAll('g[class^="legend"]').forEach(function(g){if(!/^legend\\d*$/.test(g.getAttribute('class')))return;
  var cls=g.getAttribute('class'), title=g.querySelector('.'+cls+'titletext');
  out.legends[g.getAttribute('class')]={title:title?title.textContent:'',box:box(g.querySelector('.bg')),
   entries:Array.prototype.map.call(g.querySelectorAll('.traces'),function(t){
    return [t.textContent].concat(box(t.querySelector('.'+cls+'text')));})};});
 div.querySelectorAll('.textpoint text').forEach(function(t){if(!t.textContent)return;
  out.texts.push([t.textContent,t.closest('.trace').__data__[0].trace.name].concat(box(t)));});
 div.querySelectorAll('.scatterlayer .points path').forEach(function(p){out.points.push(box(p));});
 document.querySelectorAll('#summary-table tbody tr').forEach(function(tr){out.table.push(tr.children[1].dataset.v);});
 var pre=document.createElement('pre');pre.id='drawn';pre.textContent=JSON.stringify(out);
 document.body.appendChild(pre);}, 3000);
</script></body>"""


def _overlap(a, b) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > 1 and min(a[3], b[3]) - max(a[1], b[1]) > 1


def test_at_50_variants_each_strategy_has_a_legend_column_and_points_carry_their_labels(page, tmp_path):
    path, _ = page
    drawn = probed(path, tmp_path, DRAWN, "drawn")
    # plotly's own data: 50 variants in the panel, no two with the same symbol and colour
    assert len(drawn["traces"]) == 50 and len({tuple(t[2:]) for t in drawn["traces"]}) == 50
    # a legend per strategy, each a column (its entries one under the other) titled by its strategy, below
    # the panel's speed axis, inside the figure, clear of the other legends
    legends = drawn["legends"]
    assert [v["title"] for v in legends.values()][:6] == ["top_p", "top_k", "min_p", "typical", "greedy", "beam"]
    assert sum(len(v["entries"]) for v in legends.values()) == 50 + 2  # and the Pareto front, the reference
    for name, legend in legends.items():
        lefts = {round(e[1]) for e in legend["entries"]}
        assert len(lefts) == 1, (name, lefts)  # one column: no entry wrapped beside another
        assert legend["box"][1] >= drawn["axis"][3] and legend["box"][3] <= drawn["svg"][3], name
        others = [v["box"] for k, v in legends.items() if k != name]
        assert not any(_overlap(legend["box"], b) for b in others), name
    # the variants written beside their points where they fit: over no other label and no point
    texts = drawn["texts"]
    assert len(texts) >= 5, texts
    assert all(t[0] == t[1] for t in texts)  # each label its point's variant, as the legend names it
    for i, t in enumerate(texts):
        assert not any(_overlap(t[2:], u[2:]) for u in texts[i + 1 :]), t
        assert not any(_overlap(t[2:], p) for p in drawn["points"]), t
    # the chart and the table name the variants alike
    assert set(drawn["table"]) - {"reference"} == {t[0] for t in drawn["traces"]}
    shot = path.parent / "still-50-1280.png"
    proc = browse(tmp_path, path.as_uri(), f"--screenshot={shot}", "--window-size=1280,2600")
    assert proc.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG"


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
    pages = [" ".join(page.split()) for page in poppler("pdftotext", pdf).split("\f")]
    text = " ".join(pages)
    assert "Quality vs speed" in text and "does not apply" in text
    chart = next(page for page in pages if "Quality vs speed (the Pareto" in page)  # whole on its page:
    assert all(x in chart for x in ("top_p(p=0.5)", "top_k(k=1000)", "typical(typical_p=0.99)", "beam", "reference"))
    for hint in ("Click a header", "Hover a", "click a legend", "hover a point"):
        assert hint not in text, hint
