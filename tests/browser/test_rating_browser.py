"""A rating sheet's HTML page in headless Chromium: keys 1-5 record scores, the saved CSV imports."""

from __future__ import annotations

import csv
import html
import io
import re

from controller.report.ratings.scores import parse_sheet
from controller.report.ratings.sheets import sheet_html
from tests.support.browser import browse

ITEMS = [{"item": f"i{n:010x}", "prompt": f'Prompt {n}, "quoted"', "text": f"Text {n}\nline"} for n in range(3)]
ITEMS[2] = {**ITEMS[2], "prompt": '=HYPERLINK("http://evil.example","x")', "text": "@SUM(1+1)"}  # formulas
# Presses real keys, then clicks "Save" and writes the downloaded file's text into the page.
DRIVER = """<script>
HTMLAnchorElement.prototype.click = function () {
  var name = this.download;
  fetch(this.href).then(function (r) { return r.text(); }).then(function (t) {
    document.getElementById("saved").textContent = name + "\\n" + t; });
};
["1","5","3","4","ArrowLeft","2","2","x"].forEach(function (k) {
  document.dispatchEvent(new KeyboardEvent("keydown", {key: k}));
});
document.getElementById("export").click();
</script><pre id="saved"></pre></body>"""


def test_keyboard_scores_are_saved_as_an_importable_csv(tmp_path):
    page = sheet_html("r1", ITEMS, ["fluency", "coherence"]).decode().replace("</body>", DRIVER, 1)
    path = tmp_path / "sheet.html"
    path.write_text(page)
    proc = browse(tmp_path, path.as_uri(), "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = html.unescape(re.search(r'<pre id="saved">(.*?)</pre>', proc.stdout, re.S).group(1))
    name, body = saved.split("\n", 1)
    assert name == "ratings-r1.csv"
    rows = list(csv.DictReader(io.StringIO(body)))
    # 1 5 scored the first text, 3 4 the second, ← went back and 2 2 re-scored it; the third is unscored
    assert [(r["fluency"], r["coherence"]) for r in rows] == [("1", "5"), ("2", "2"), ("", "")]
    assert rows[0]["prompt"] == ITEMS[0]["prompt"] and rows[0]["text"] == ITEMS[0]["text"]
    assert rows[2]["prompt"] == "'" + ITEMS[2]["prompt"] and rows[2]["text"] == "'@SUM(1+1)"  # shown, never run
    key = {"criteria": ["fluency", "coherence"], "raters": ["r1"], "items": {i["item"]: {} for i in ITEMS}}
    assert parse_sheet(name, body.encode(), key)["r1"][ITEMS[1]["item"]] == {"fluency": 2, "coherence": 2}
