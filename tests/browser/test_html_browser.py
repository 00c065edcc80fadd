"""report.html in headless Chromium: it loads offline, without script errors, and draws its charts.

Chromium comes from `scripts/install-chromium.sh` (Debian package `chromium`), which
`make test` runs; without a browser the test fails rather than pass unchecked. Every host name resolves to nothing,
so a page that needed a CDN would fail here.
"""

from __future__ import annotations

import re

import pytest

from controller.report.compute.aggregate import summarize
from controller.report.render.write import write_reports
from tests.support.browser import browse
from tests.support.report import make_sweep, write_sweep
from worker.store import FileStore


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    store = FileStore(root)
    data = make_sweep(
        seeds=(0, 1),
        n_prompts=8,
        cells=[
            ("austen-tiny", "greedy", {}),
            ("austen-tiny", "top_p", {"p": 0.9}),
            ("austen-small", "greedy", {}),
            ("austen-small", "top_p", {"p": 0.9}),
        ],
    )
    write_sweep(store, data)
    summary = summarize(data, n_boot=100, n_boot_corpus=10)
    key = write_reports(store, data.tenant, data.sweep_id, summary, data)["html"]
    return root / key, summary


def test_report_loads_offline_without_errors_and_draws_charts(tmp_path, report_file):
    path, summary = report_file
    proc = browse(tmp_path, f"{path.as_uri()}#sort=-tokens_per_s", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    errors = re.search(r'<pre id="js-errors">(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1) == "", errors and errors.group(1)
    chart_divs = re.findall(r'<div id="(chart-[\w.-]+)" class="chart[^"]*js-plotly-plot', dom)
    assert "chart-quality-speed" in chart_divs
    assert {"chart-tokens_per_s", "chart-diversity", "chart-self_bleu_4", "chart-bleu"} <= set(chart_divs)
    assert dom.count('class="main-svg"') >= len(chart_divs)
    assert "Pareto front" in dom and "errorbar" in dom  # the front is drawn, intervals too
    # #sort=-tokens_per_s sorted the table by speed, fastest first, the reference row last.
    table = dom[dom.index('id="summary-table"') :]
    table = table[: table.index("</table>")]
    at = re.findall(r'<th data-col="(\w+)"', table).index("tokens_per_s")  # the quality columns come first
    speeds = [
        float(v) if v else None
        for v in re.findall(r"<tr[^>]*>(?:<td[^>]*>[^<]*</td>){" + str(at) + r'}<td[^>]*data-v="([^"]*)"', table)
    ]
    assert len(speeds) == 5 and speeds[-1] is None and speeds[:-1] == sorted(speeds[:-1], reverse=True)


def test_report_screenshot(tmp_path, report_file):
    path, _ = report_file
    shot = tmp_path / "report.png"
    proc = browse(tmp_path, path.as_uri(), f"--screenshot={shot}", "--window-size=1400,2000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


# Names that would run a script if any writer (the table, plotly's labels and panel titles, the
# examples, the provenance) let them through as markup: plotly reads <a href> in its texts.
RUN_IMG = "<img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">"
RUN_LINK = "<a href=\"javascript:document.body.setAttribute('data-pwned','link')\">x"
PHISH = '<a href="https:evil.example">sign in'  # a model's label (no "/"): plotly drew it as a live link
CLICK_EVERY_LINK = """<script>setTimeout(function(){
 document.querySelectorAll('svg a, a[href^="javascript"]').forEach(function(a){
  a.dispatchEvent(new MouseEvent('click', {bubbles: true}));});
 var pre=document.createElement('pre');pre.id='clicked';document.body.appendChild(pre);}, 3000);
</script></body>"""


def test_hostile_names_stay_text_in_the_browser(tmp_path):
    """Issue 28, item 5: sweep, model and sample payloads in report.html, in Chromium, with every link
    that plotly drew clicked: nothing runs, the page reports no script error, and each payload reads as text."""
    cells = [(RUN_IMG, "greedy", {}), (RUN_LINK, "top_p", {"p": 0.9}), (PHISH, "greedy", {})]
    data = make_sweep(seeds=(0, 1), n_prompts=8, cells=cells)
    data.spec["name"] = RUN_IMG
    data.generations = [g.model_copy(update={"text": RUN_LINK + " " + g.text}) for g in data.generations]
    summary = summarize(data, n_boot=20, n_boot_corpus=5)
    store = FileStore(tmp_path / "store")
    write_sweep(store, data)
    key = write_reports(store, data.tenant, data.sweep_id, summary, data, formats=("html",))["html"]
    page = tmp_path / "hostile.html"
    page.write_text((tmp_path / "store" / key).read_text().replace("</body>", CLICK_EVERY_LINK))
    proc = browse(tmp_path, page.as_uri(), "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert '<pre id="clicked"></pre>' in dom and "data-pwned=" not in dom.replace("setAttribute('data-pwned'", "")
    errors = re.search(r'<pre id="js-errors">(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1) == "", errors and errors.group(1)
    assert dom.count("&lt;img src=x onerror=") >= 3 and dom.count('&lt;a href="javascript:') >= 3
    assert dom.count('class="main-svg"') >= 4  # the charts were drawn with the names in them
    assert not re.search(r"<a[^>]*evil\.example", dom), "a name became a live link in a chart"
    assert dom.count('&lt;a href="https:evil.example"&gt;sign in') >= 3  # drawn as the text it is
