"""Blinded rating sheets: sample items across cells, hide which cell each is, one CSV and one HTML per rater.

`export_sheets(data, ...)` is pure: it returns the key (which hidden item id is which cell and
prompt; stored beside the sweep, never given to raters) and each rater's sheet. Items are drawn
reproducibly (`seed`) and stratified: `items` generations spread evenly over the cells, so every
cell is rated; the prompt set's reference for each drawn prompt is mixed in as a control (the
`reference` row). Each rater sees every item, in an order shuffled for that rater. A sheet
carries only an opaque item id, the prompt and the text: no model, strategy or cell name.

Blinding: by default every random choice (the sample, the ids, each rater's order) comes from
the operating system's secret source (`secrets.SystemRandom`) and is kept only in the key beside
the sweep, so nobody can replay it from the public code and the sweep. A `seed` makes an export
reproducible, and therefore replayable by anyone who knows the seed: the CLI warns.
"""

from __future__ import annotations

import csv
import html
import io
import json
import random
import re
import secrets
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from typing import Any

from controller.report.compute.columns import REFERENCE
from controller.report.load.sweep import SweepData
from worker.core.errors import UsageError
from worker.core.safetext import csv_row

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
SCORES = range(1, 6)
FIXED_COLUMNS = ["item", "rater", "prompt", "text"]
# What each built-in criterion asks (shown on the HTML sheet and in instructions.txt); other
# criteria are defined with `rate export --define NAME=TEXT`.
DEFINITIONS = {
    "fluency": "Is the text well-formed language, read sentence by sentence: grammatical, natural word "
    "choice, no garbled or broken phrases? Judge the language only, not whether it fits the prompt.",
    "coherence": "Does the text hang together and follow from the prompt: on topic, its ideas connected, "
    "no contradictions, loops or abrupt jumps? Judge the whole text, not its grammar.",
}
SCALE = "1 = very poor, 2 = poor, 3 = acceptable, 4 = good, 5 = very good"


def definitions_for(criteria: list[str], given: dict[str, str] | None = None) -> dict[str, str]:
    """Each criterion's definition: given, built in, or a request to agree on one before rating."""
    given = given or {}
    return {
        c: given.get(c) or DEFINITIONS.get(c) or "(no definition given: agree on one before rating)" for c in criteria
    }


def instructions(criteria: list[str], definitions: dict[str, str], n_items: int) -> str:
    """instructions.txt of an export: the criteria, the scale and how to return a sheet."""
    lines = [
        f"Rate each of the {n_items} texts on each criterion, {SCALE}.",
        "Open your sheet-<name>.html in a browser (keys 1-5 score, arrows move, e saves a CSV),",
        "or fill the criterion columns of your sheet-<name>.csv. Return the CSV file.",
        "",
        *(f"{c}: {definitions[c]}" for c in criteria),
        "",
    ]
    return "\n".join(lines)


@dataclass
class Sheets:
    """An export: the key (item id -> {cell, prompt_id, job_seed, sample}) and each rater's items in their order."""

    key: dict[str, Any]
    items: dict[str, list[dict[str, str]]]  # rater -> [{"item", "prompt", "text"}]


def check_names(kind: str, names: list[str]) -> list[str]:
    """Raters and criteria: short names of letters, digits, '-' and '_', each once."""
    bad = [n for n in names if not NAME.fullmatch(n)]
    if bad or not names or len(set(names)) != len(names):
        raise UsageError(f"{kind}: give distinct names of letters, digits, '-' and '_' (got {', '.join(names)!r})")
    return names


def _quotas(n_items: int, cells: list[str]) -> dict[str, int]:
    if n_items < len(cells):
        raise UsageError(f"--items {n_items} is fewer than the sweep's {len(cells)} cells; every cell must be rated")
    base, extra = divmod(n_items, len(cells))
    return {c: base + (i < extra) for i, c in enumerate(cells)}


def _rng(seed: int | None, salt: str = "") -> random.Random:
    """A secret source (seed None), else a reproducible one for `seed` and `salt`."""
    return secrets.SystemRandom() if seed is None else random.Random(f"{seed}:{salt}" if salt else seed)


def sample_items(data: SweepData, n_items: int, seed: int | None = None) -> list[dict[str, Any]]:
    """Generations drawn per cell (stratified), then the references of the drawn prompts; each with a hidden id.

    The list is shuffled across cells before the ids are drawn, so neither the ids nor their
    order follow the cells; with `seed` None everything comes from `secrets.SystemRandom`."""
    by_cell: dict[str, list] = defaultdict(list)
    for g in data.generations:
        by_cell[g.cell].append(g)
    cells = sorted(by_cell)
    if not cells:
        raise UsageError(f"sweep {data.sweep_id} has no generations to rate")
    rng = _rng(seed)
    drawn = []
    for cell, quota in _quotas(n_items, cells).items():
        records = sorted(by_cell[cell], key=lambda g: (g.prompt_id, g.job_seed, g.sample))
        drawn += [
            {
                "cell": cell,
                "prompt_id": g.prompt_id,
                "job_seed": g.job_seed,
                "sample": g.sample,
                "prompt": g.prompt,
                "text": g.text,
            }
            for g in rng.sample(records, min(quota, len(records)))
        ]
    prompts = {p.id: p for p in data.prompts}
    for pid in sorted({d["prompt_id"] for d in drawn}):
        if pid in prompts and prompts[pid].reference:
            p = prompts[pid]
            drawn.append(
                {
                    "cell": REFERENCE,
                    "prompt_id": pid,
                    "job_seed": None,
                    "sample": None,
                    "prompt": p.prompt,
                    "text": p.reference,
                }
            )
    rng.shuffle(drawn)
    ids = set()
    for d in drawn:
        while (item := f"i{rng.getrandbits(40):010x}") in ids:
            pass
        ids.add(item)
        d["item"] = item
    return drawn


def export_sheets(
    data: SweepData, n_items: int, raters: list[str], criteria: list[str], seed: int | None = None, round_id: str = "1"
) -> Sheets:
    """The key and every rater's shuffled items (see the module doc); `seed` None: secret, not replayable. The
    export is rating round `round_id`: each item id starts with it (`<round>-i…`), so a returned sheet names
    its round."""
    check_names("--raters", raters)
    check_names("--criteria", criteria)
    drawn = sample_items(data, n_items, seed)
    for d in drawn:
        d["item"] = f"{round_id}-{d['item']}"
    key = {
        "round": round_id,
        "seed": seed,  # None: drawn from the secret source, not reproducible
        "n_controls": sum(d["cell"] == REFERENCE for d in drawn),
        "criteria": criteria,
        "raters": raters,
        "items": {d["item"]: {k: d[k] for k in ("cell", "prompt_id", "job_seed", "sample")} for d in drawn},
    }
    items: dict[str, list[dict[str, str]]] = {}
    for rater in raters:
        order = [{"item": d["item"], "prompt": d["prompt"], "text": d["text"]} for d in drawn]
        _rng(seed, rater).shuffle(order)
        items[rater] = order
    return Sheets(key, items)


def sheet_csv(rater: str, items: list[dict[str, str]], criteria: list[str]) -> bytes:
    """One rater's sheet: item, rater, prompt, text and an empty column per criterion (1-5 to fill in)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(FIXED_COLUMNS + criteria)
    for it in items:
        writer.writerow(csv_row([it["item"], rater, it["prompt"], it["text"]]) + [""] * len(criteria))
    return buf.getvalue().encode()


def sheet_html(
    rater: str, items: list[dict[str, str]], criteria: list[str], definitions: dict[str, str] | None = None
) -> bytes:
    """An offline page: one item at a time, keys 1-5 score the current criterion, the sheet is exported as CSV."""
    defined = definitions_for(criteria, definitions)
    terms = "".join(f"<dt>{html.escape(c)}</dt><dd>{html.escape(defined[c])}</dd>" for c in criteria)
    payload = json.dumps({"rater": rater, "criteria": criteria, "columns": FIXED_COLUMNS, "items": items})
    payload = payload.replace("<", "\\u003c")  # no '</script>' inside the data
    script = resources.files("controller.report.ratings").joinpath("assets/rating.js").read_text()
    title = html.escape(f"Rating sheet: {rater}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:48rem;margin:2rem auto;padding:0 1rem}}
.prompt{{color:#555}}.text{{white-space:pre-wrap;border-left:3px solid #ccc;padding-left:1rem}}
.crit.cur{{font-weight:bold;background:#ffe}}.small{{color:#666;font-size:.85rem}}</style></head><body>
<h1>{title}</h1>
<p class="small">Read the prompt and its continuation. Keys <b>1</b>-<b>5</b> score the highlighted criterion
(1 worst, 5 best) and move on; <b>←</b>/<b>→</b> go to the previous/next text; <b>e</b> or the button saves
your scores as a CSV file to send back.</p>
<dl class="small">{terms}<dt>scale</dt><dd>{html.escape(SCALE)}</dd></dl>
<div id="pos"></div><p class="prompt" id="prompt"></p><p class="text" id="text"></p><div id="crits"></div>
<p><button id="export" type="button">Save my scores (CSV)</button> <span id="done" class="small"></span></p>
<script type="application/json" id="sheet">{payload}</script>
<script>
{script}</script>
</body></html>
""".encode()
