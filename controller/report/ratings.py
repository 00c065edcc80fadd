"""Returned rating sheets: validate, store beside the sweep, and summarise per cell (mean, 95% CI, Krippendorff's α).

`parse_sheet(name, body, key)` checks one returned CSV (an unknown item, a score outside 1-5,
a duplicate row, a missing or unknown rater: a `UsageError` naming the file and row);
`import_sheets` validates every file before it writes anything, so a refused import loses
nothing already imported. `rating_columns(key, sheets)` adds per cell and criterion c:
`rating_c` (the mean of all its scores), `rating_c_ci_low/high` (95% studentised bootstrap over
items, each item with all its raters' scores) and `rating_c_alpha` (Krippendorff's α, ordinal,
over that cell's items; empty with fewer than two raters or no variation).
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from typing import Any

import krippendorff
import numpy as np
import pandas as pd

from controller.report.rating_sheets import FIXED_COLUMNS, SCORES
from worker.core import paths
from worker.core.errors import UsageError
from worker.store import Store

N_BOOT = 1000


def parse_sheet(name: str, body: bytes, key: dict[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """rater -> item -> {criterion: score} of one returned CSV; blank scores are not rated."""
    try:
        rows = list(csv.reader(io.StringIO(body.decode("utf-8-sig"))))
    except (UnicodeDecodeError, csv.Error) as err:
        raise UsageError(f"{name}: not a CSV rating sheet ({err})") from None
    criteria = key["criteria"]
    if not rows or rows[0][: len(FIXED_COLUMNS)] != FIXED_COLUMNS or not set(criteria) <= set(rows[0]):
        raise UsageError(f"{name}: row 1: the header must be {','.join(FIXED_COLUMNS + criteria)}")
    header = rows[0]
    out: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    for n, row in enumerate(rows[1:], start=2):
        if not any(v.strip() for v in row):
            continue
        rec = dict(zip(header, row))
        item, rater = rec.get("item", "").strip(), rec.get("rater", "").strip()
        if not rater:
            raise UsageError(f"{name}: row {n}: missing rater")
        if rater not in key["raters"]:
            raise UsageError(f"{name}: row {n}: unknown rater {rater!r}; exported: {', '.join(key['raters'])}")
        if item not in key["items"]:
            raise UsageError(f"{name}: row {n}: unknown item {item!r}")
        if item in out[rater]:
            raise UsageError(f"{name}: row {n}: duplicate row for item {item!r} and rater {rater!r}")
        scores = {}
        for c in criteria:
            raw = (rec.get(c) or "").strip()
            if not raw:
                continue
            if not raw.isdigit() or int(raw) not in SCORES:
                raise UsageError(f"{name}: row {n}: {c} score {raw!r} is outside 1-5")
            scores[c] = int(raw)
        out[rater][item] = scores
    return dict(out)


def load_key(store: Store, tenant: str, sweep_id: str) -> dict[str, Any] | None:
    key = paths.ratings_key(tenant, sweep_id, paths.RATINGS_KEY_FILE)
    return store.read_json(key) if store.exists(key) else None


def load_sheets(store: Store, tenant: str, sweep_id: str) -> dict[str, dict[str, dict[str, int]]]:
    """rater -> item -> {criterion: score}, from every imported sheet."""
    sheets = {}
    for k in store.list(paths.rater_sheets_prefix(tenant, sweep_id)):
        doc = store.read_json(k)
        sheets[doc["rater"]] = doc["scores"]
    return sheets


def import_sheets(store: Store, tenant: str, sweep_id: str, files: list[tuple[str, bytes]]) -> dict[str, int]:
    """Validate every file, then store one sheet per rater (a rater's new sheet replaces theirs); rater -> rows."""
    key = load_key(store, tenant, sweep_id)
    if key is None:
        raise UsageError(f"sweep {sweep_id} has no exported rating sheets; run `decodebench rate export` first")
    merged: dict[str, tuple[str, dict]] = {}
    for name, body in files:
        for rater, scores in parse_sheet(name, body, key).items():
            if rater in merged:
                raise UsageError(f"{name}: rater {rater!r} also returned {merged[rater][0]}: duplicate sheet")
            merged[rater] = (name, scores)
    for rater, (name, scores) in merged.items():
        store.write_json(
            paths.rater_sheet_key(tenant, sweep_id, rater), {"rater": rater, "source": name, "scores": scores}
        )
    return {rater: len(scores) for rater, (_, scores) in merged.items()}


def alpha(matrix: np.ndarray) -> float:
    """Krippendorff's α, ordinal, of a raters × items matrix (NaN: not rated); NaN where undefined."""
    if matrix.shape[0] < 2 or np.sum(~np.isnan(matrix)) < 2:
        return math.nan
    try:
        with np.errstate(invalid="ignore", divide="ignore"):  # no variation: NaN, reported empty
            value = krippendorff.alpha(
                reliability_data=matrix, level_of_measurement="ordinal", value_domain=list(SCORES)
            )
    except (ValueError, ZeroDivisionError):
        return math.nan
    return float(value) if np.isfinite(value) else math.nan


def _bootstrap(per_item: list[list[int]], rng: np.random.Generator) -> tuple[float, float]:
    """Studentised bootstrap interval over items of the mean score (each item with all its scores)."""
    from controller.metrics import ratio
    from controller.report.intervals import studentized, values_of

    sums = np.array([[sum(s), len(s)] for s in per_item], dtype=float)
    if len(per_item) < 2:
        return math.nan, math.nan
    interval = studentized(sums, values_of(ratio), n_boot=N_BOOT, rng=rng, is_ratio=True)
    return interval if interval is not None else (math.nan, math.nan)


def rating_columns(key: dict[str, Any], sheets: dict[str, dict[str, dict[str, int]]], seed: int = 0) -> pd.DataFrame:
    """One row per rated cell: `cell`, and per criterion c: rating_c, rating_c_ci_low/high, rating_c_alpha."""
    raters = sorted(sheets)
    items_by_cell: dict[str, list[str]] = defaultdict(list)
    for item, where in key["items"].items():
        items_by_cell[where["cell"]].append(item)
    rows = []
    for cell, items in sorted(items_by_cell.items()):
        row: dict[str, Any] = {"cell": cell}
        for c in key["criteria"]:
            matrix = np.array(
                [[sheets[r].get(i, {}).get(c, math.nan) for i in items] for r in raters], dtype=float
            ).reshape(len(raters), len(items))
            per_item = [[int(v) for v in matrix[:, j] if not math.isnan(v)] for j in range(len(items))]
            per_item = [s for s in per_item if s]
            scores = [v for s in per_item for v in s]
            row[f"rating_{c}"] = float(np.mean(scores)) if scores else math.nan
            lo, hi = _bootstrap(per_item, np.random.default_rng([seed, len(rows)])) if scores else (math.nan,) * 2
            row[f"rating_{c}_ci_low"], row[f"rating_{c}_ci_high"] = lo, hi
            row[f"rating_{c}_alpha"] = alpha(matrix)
        rows.append(row)
    return pd.DataFrame(rows)


def add_ratings(summary: pd.DataFrame, ratings: pd.DataFrame | None) -> pd.DataFrame:
    """The summary with the rating columns joined on `cell` (rows and their order unchanged)."""
    if ratings is None or ratings.empty:
        return summary
    out = summary.merge(ratings, on="cell", how="left")
    out.attrs = summary.attrs
    return out


def stored_ratings(store: Store, tenant: str, sweep_id: str) -> pd.DataFrame | None:
    """The rating columns of a sweep's imported sheets; None before any import."""
    key = load_key(store, tenant, sweep_id)
    sheets = load_sheets(store, tenant, sweep_id) if key is not None else {}
    return rating_columns(key, sheets) if key is not None and sheets else None


def rating_table(summary: pd.DataFrame, fmt, params_label) -> list[tuple[str, list[str]]] | None:
    """("cell", criteria), then (row label, ["mean [low, high] · α value" per criterion]) of the rated rows.

    `fmt` and `params_label` are controller.report.format's (passed in: format imports this module)."""
    criteria = [
        c[len("rating_") : -len("_alpha")] for c in summary.columns if c.startswith("rating_") and c.endswith("_alpha")
    ]
    if not criteria:
        return None
    table = [("cell", criteria)]
    for _, row in summary.iterrows():
        if all(pd.isna(row[f"rating_{c}"]) for c in criteria):
            continue
        label = " ".join(x for x in (row["model"], row["strategy"], params_label(row["params"])) if x and x != "{}")
        cells = [
            f"{fmt(row[f'rating_{c}'])} [{fmt(row[f'rating_{c}_ci_low'])}, {fmt(row[f'rating_{c}_ci_high'])}]"
            f" · α {fmt(row[f'rating_{c}_alpha']) or '–'}"
            for c in criteria
        ]
        table.append((label, cells))
    return table


RATINGS_NOTE = (
    "Human ratings (1-5): mean of every score of the cell's rated items, 95% bootstrap interval over items, "
    "Krippendorff's α (ordinal) between raters; the reference row is the control."
)


def ratings_html(table: list[tuple[str, list[str]]] | None) -> str:
    """The HTML report's section from `rating_table`; empty without ratings."""
    from html import escape as e

    if table is None:
        return ""
    (_, header), *rows = table
    head = "".join(f'<th class="t">{e(h)}</th>' for h in ["cell", *header])
    body = "".join(
        "<tr>" + "".join(f'<td class="t">{e(v)}</td>' for v in [label, *cells]) + "</tr>" for label, cells in rows
    )
    return (
        f'<h2 id="ratings">Human ratings</h2><p class="small">{e(RATINGS_NOTE)}</p>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )
