"""report.html for a meeting (issue 28, item 2), checked in headless Chromium on a 42-cell sweep
(two models, 21 strategy variants): labels carry every parameter that varies, no two labels of a
chart overlap (their bounding boxes, measured in the page), the summary table's printed tables fit
the page, and the plots print whole. Printed without the example texts (the default at 42 cells, or
the page's checkbox ticked), the PDF is shorter and still carries every table row and every chart;
with them, the texts are there, escaped. Screenshots at 1440 px and the PDFs stay in the test's
directory (the artefacts: report-1440.png, report.pdf, report-with-samples.pdf). The PDFs are read
with poppler's pdftotext and pdfinfo (scripts/install-chromium.sh installs them with Chromium)."""

from __future__ import annotations

import json
import re

import pytest

from controller.report.compute.aggregate import summarize
from controller.report.render.html import render_html
from controller.report.render.labels import cell_labels
from tests.support.browser import browse, poppler
from tests.support.report import make_sweep

VARIANTS = (
    [("greedy", {}), ("beam", {"num_beams": 4})]
    + [("top_p", {"p": p, "temperature": 1.0}) for p in (0.8, 0.9, 0.95)]
    + [("top_k", {"k": k, "temperature": t}) for k in (10, 40, 100) for t in (0.7, 1.0)]
    + [("min_p", {"min_p": m}) for m in (0.02, 0.05, 0.1)]
    + [("typical", {"typical_p": t}) for t in (0.2, 0.9, 0.95)]
    + [("contrastive", {"penalty_alpha": a, "top_k": 4}) for a in (0.4, 0.6, 0.8)]
    + [("temperature", {"temperature": 0.7})]
)
CELLS = [(model, s, p) for model in ("austen-tiny", "austen-small") for s, p in VARIANTS]

# Measures the page once the charts are drawn and writes the findings into the DOM for --dump-dom.
PROBE = """<script>
setTimeout(function(){
 function boxes(sel, root){return Array.prototype.map.call(root.querySelectorAll(sel),function(n){
  var r=n.getBoundingClientRect();return {t:n.textContent,l:r.left,r:r.right,top:r.top,b:r.bottom};})
  .filter(function(b){return b.r>b.l&&b.b>b.top&&b.t;});}
 var out={overlaps:[],charts:0};
 document.querySelectorAll('.js-plotly-plot').forEach(function(div){out.charts++;
  ['.xtick text','.ytick text','[class^="legend"][class$="text"]','.annotation-text','.textpoint text',
   '.gtitle'].forEach(function(sel){
   var b=boxes(sel,div);
   for(var i=0;i<b.length;i++)for(var j=i+1;j<b.length;j++){
    var x=Math.min(b[i].r,b[j].r)-Math.max(b[i].l,b[j].l), y=Math.min(b[i].b,b[j].b)-Math.max(b[i].top,b[j].top);
    if(x>1&&y>1)out.overlaps.push([div.id,sel,b[i].t,b[j].t]);}});});
 var pre=document.createElement('pre');pre.id='probe';pre.textContent=JSON.stringify(out);
 document.body.appendChild(pre);}, 3000);
</script></body>"""


# A sample text that would mark the page if the browser ran it, and a word found only in that text.
PAYLOAD = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
MARKER = "zanzibarsample"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    data = make_sweep(seeds=(0, 1), n_prompts=8, shard_size=4, cells=CELLS)
    g = data.generations[0]  # austen-tiny greedy, the first prompt: among the examples
    data.generations[0] = g.model_copy(update={"text": f"{PAYLOAD} {MARKER} {g.text}"})
    summary = summarize(data, n_boot=30, n_boot_corpus=5)
    out = tmp_path_factory.mktemp("report")
    path = out / "report.html"
    path.write_text(render_html(summary, data))  # 42 cells: printed without the examples by default
    return path, summary, data


def test_labels_carry_every_parameter_that_varies(page):
    _, summary, _ = page
    labels = [x for x, m in zip(cell_labels(summary, with_model=False), summary["model"]) if m == "austen-tiny"]
    assert {"top_p(p=0.8)", "top_p(p=0.9)", "top_p(p=0.95)"} <= set(labels)  # 0.9 is top_p's default
    assert "top_k(k=40,temperature=1.0)" in labels and "greedy" in labels
    assert len(set(labels)) == len(labels)


def test_no_chart_labels_overlap_at_1440px(page, tmp_path):
    path, _, _ = page
    probed = tmp_path / "probed.html"
    probed.write_text(path.read_text().replace("</body>", PROBE))
    proc = browse(tmp_path, probed.as_uri(), "--window-size=1440,2000", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S).group(1).replace("&quot;", '"'))
    assert found["charts"] >= 5
    assert found["overlaps"] == [], found["overlaps"][:10]
    shot = path.parent / "report-1440.png"
    proc = browse(tmp_path, path.as_uri(), f"--screenshot={shot}", "--window-size=1440,6000")
    assert proc.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG"


def test_printed_tables_fit_the_page_and_plots_print_whole(page, tmp_path):
    path, _, _ = page
    probe = """<script>window.matchMedia('print');setTimeout(function(){
     var page=document.documentElement.clientWidth, wide=[];
     document.querySelectorAll('table.print-table').forEach(function(t){
      if(t.getBoundingClientRect().right>page+1)wide.push(t.caption.textContent+':'+t.getBoundingClientRect().width);});
     var pre=document.createElement('pre');pre.id='probe';pre.textContent=JSON.stringify({wide:wide,
      tables:document.querySelectorAll('table.print-table').length});document.body.appendChild(pre);},3000);
    </script></body>"""
    probed = tmp_path / "probed.html"
    # the print stylesheet applied on screen at the printed width (A4 landscape less margins: 277 mm)
    text = path.read_text().replace("@media print{", "@media all{").replace("</body>", probe)
    probed.write_text(text)
    proc = browse(tmp_path, probed.as_uri(), "--window-size=1047,1400", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S).group(1).replace("&quot;", '"'))
    assert found["tables"] >= 3 and found["wide"] == []
    pdf = path.parent / "report.pdf"
    proc = browse(tmp_path, path.as_uri(), f"--print-to-pdf={pdf}", "--no-pdf-header-footer")
    assert proc.returncode == 0 and pdf.read_bytes()[:5] == b"%PDF-"


def printed(tmp_path, html, pdf):
    proc = browse(tmp_path, html.as_uri(), f"--print-to-pdf={pdf}", "--no-pdf-header-footer")
    assert proc.returncode == 0 and pdf.read_bytes()[:5] == b"%PDF-", proc.stderr[-2000:]
    pages = int(re.search(r"^Pages:\s+(\d+)", poppler("pdfinfo", pdf), re.M).group(1))
    return pages, " ".join(poppler("pdftotext", pdf).split())


def chart_pages(pdf) -> list[str]:
    """The text of each printed page from the quality-vs-speed chart to the Examples heading."""
    pages = [" ".join(p.split()) for p in poppler("pdftotext", pdf).split("\f")]
    first = next(i for i, p in enumerate(pages) if "Quality vs speed (the Pareto" in p)
    last = next(i for i, p in enumerate(pages) if "example texts left out" in p)
    return pages[first : last + 1]


def before_examples(text: str) -> str:
    return re.sub(r"written \S+", "", text).split(" Examples ")[0]


def test_printing_without_the_samples_is_shorter_and_keeps_every_table_and_chart(page, tmp_path):
    path, summary, data = page
    with_samples = path.parent / "report-with-samples.html"
    with_samples.write_text(render_html(summary, data, print_samples=True))
    ticked = tmp_path / "ticked.html"  # the reader ticks "print without examples" before printing
    click = "<script>document.getElementById('print-no-samples').click();</script></body>"
    ticked.write_text(with_samples.read_text().replace("</body>", click))
    long, full = printed(tmp_path, with_samples, path.parent / "report-with-samples.pdf")
    short, text = printed(tmp_path, path, path.parent / "report.pdf")
    clicked, _ = printed(tmp_path, ticked, tmp_path / "ticked.pdf")
    assert short < long and clicked == short, (short, long, clicked)
    assert MARKER in full and "onerror" in full  # the sample printed as text ...
    assert MARKER not in text and "onerror" not in text  # ... and left out
    n = path.read_text().split('<div id="samples">')[1].count('<div class="card')
    assert f"Examples {n} example texts left out of this printout" in text
    # every table and chart whole: the printout reads as the one with the samples but for them
    assert before_examples(text) == before_examples(full)
    after = [set(t.split(" Glossary ")[1].split()) for t in (text, full)]  # glossary and spec: breaks move
    assert after[0] == after[1]
    assert text.count("austen-small · contrastive(penalty_alpha=0.8)") >= 9 + 20  # 9 tables, 20+ charts
    assert all(t in text for t in ("Quality vs speed", "tokens_per_s (higher is better)", "rouge_l (higher is better)"))
    charts = chart_pages(path.parent / "report.pdf")  # each chart whole on its page:
    assert charts[0].count("tokens/s (higher is better)") == 2  # both panels' speed axes under their title
    first, last = (
        "austen-tiny · greedy",
        "austen-small · temperature",
    )  # a bar chart's first and last rows
    assert [p.count(first) for p in charts] == [p.count(last) for p in charts] and sum(
        p.count(last) for p in charts
    ) >= 20
    proc = browse(tmp_path, with_samples.as_uri(), "--dump-dom")  # the payload stayed text in the browser
    assert proc.returncode == 0 and 'data-pwned="1"' not in proc.stdout and "&lt;img src=x onerror=" in proc.stdout
