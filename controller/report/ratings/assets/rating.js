// A rating sheet, offline: one item at a time; keys 1-5 score the current criterion, then the next
// criterion (or item); ArrowLeft/ArrowRight move between items; "e" or the button saves a CSV with
// the same columns as the CSV sheet (item, rater, prompt, text, one column per criterion).
(function () {
  "use strict";
  var sheet = JSON.parse(document.getElementById("sheet").textContent);
  var scores = {}; // item -> {criterion: score}
  var pos = 0, crit = 0;
  function el(id) { return document.getElementById(id); }
  function rated() {
    return sheet.items.filter(function (it) {
      var s = scores[it.item] || {};
      return sheet.criteria.every(function (c) { return s[c]; });
    }).length;
  }
  function show() {
    var it = sheet.items[pos], s = scores[it.item] || {};
    el("pos").textContent = "Text " + (pos + 1) + " of " + sheet.items.length;
    el("prompt").textContent = it.prompt;
    el("text").textContent = it.text;
    el("crits").innerHTML = "";
    sheet.criteria.forEach(function (c, i) {
      var d = document.createElement("div");
      d.className = "crit" + (i === crit ? " cur" : "");
      d.textContent = c + ": " + (s[c] || "-");
      el("crits").appendChild(d);
    });
    el("done").textContent = rated() + " of " + sheet.items.length + " texts fully scored";
  }
  // A CSV cell, spreadsheet-safe as worker/core/safetext.py's csv_cell (OWASP): text that starts
  // with = + - @, a tab or a carriage return gets a leading ' so it is never run as a formula.
  function cell(v) {
    if (typeof v === "string" && /^[=+\-@\t\r]/.test(v)) { v = "'" + v; }
    v = v === undefined || v === null ? "" : String(v);
    return /[",\n\r]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v;
  }
  function csv() {
    var lines = [sheet.columns.concat(sheet.criteria).map(cell).join(",")];
    sheet.items.forEach(function (it) {
      var s = scores[it.item] || {};
      var row = [it.item, sheet.rater, it.prompt, it.text].concat(sheet.criteria.map(function (c) { return s[c] || ""; }));
      lines.push(row.map(cell).join(","));
    });
    return lines.join("\n") + "\n";
  }
  function save() {
    var blob = new Blob([csv()], { type: "text/csv" });
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "ratings-" + sheet.rater + ".csv";
    document.body.appendChild(a);
    a.click();
    a.remove();
  }
  function key(k) {
    if (k >= "1" && k <= "5" && k.length === 1) {
      var it = sheet.items[pos];
      (scores[it.item] = scores[it.item] || {})[sheet.criteria[crit]] = Number(k);
      if (++crit >= sheet.criteria.length) { crit = 0; pos = Math.min(pos + 1, sheet.items.length - 1); }
    } else if (k === "ArrowRight") { pos = Math.min(pos + 1, sheet.items.length - 1); crit = 0; }
    else if (k === "ArrowLeft") { pos = Math.max(pos - 1, 0); crit = 0; }
    else if (k === "e") { save(); return; }
    else { return; }
    show();
  }
  document.addEventListener("keydown", function (ev) { key(ev.key); });
  el("export").addEventListener("click", save);
  window.__ratingSheet = { key: key, csv: csv, save: save };
  show();
})();
