"""Returned rating sheets: validate, store beside the sweep, and summarise per cell (mean, 95% CI, Krippendorff's α).

`parse_sheet(name, body, key)` checks one returned CSV (an unknown item, a score outside 1-5,
a duplicate row, a missing or unknown rater: a `UsageError` naming the file and row);
`import_sheets` validates every file before it writes anything, so a refused import loses
nothing already imported. `rating_columns(key, sheets)` adds per cell and criterion c:
`rating_c` (the mean of all its scores), `rating_c_ci_low/high` (95% studentised bootstrap over
items, each item with all its raters' scores), `rating_c_n` (the cell's items with a score),
`rating_c_alpha` (Krippendorff's α, ordinal, over that cell's items; empty with fewer than two
raters or no variation) and `rating_c_alpha_ci_low/high` (95% percentile bootstrap of α over
the cell's items). The report marks α "too few items" below a few items
(controller.report.render.ratings_table).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import krippendorff
import numpy as np
import pandas as pd

from controller.report.ratings.sheets import FIXED_COLUMNS, SCORES
from controller.sweep.prompts import sniff_encoding
from controller.sweep.wording import repeated
from worker.core import paths, settings
from worker.core.errors import UsageError, short
from worker.store import Store

N_BOOT = 1000
N_BOOT_ALPHA = 500  # α is recomputed per replicate: fewer draws, still a stable 95% interval


_SCORE_TEXT = {str(v): v for v in SCORES}
_FILE_RATER = re.compile(r"^(?:sheet|ratings)-(.+)\.csv$")
_ENCODINGS = "rating sheets, like prompt files, must be UTF-8, UTF-8 with a BOM or UTF-16 with a BOM"


def sheet_text(name: str, body: bytes) -> str:
    """A returned sheet's text: at most DECODEBENCH_RATING_SHEET_MAX_MB, decoded as its BOM says."""
    limit_mb = settings.get("rating_sheet_max_mb")
    if len(body) > limit_mb * 2**20:
        raise UsageError(
            f"{name}: {len(body):,} bytes, over the limit of {limit_mb} MiB for a rating sheet "
            "(DECODEBENCH_RATING_SHEET_MAX_MB)"
        )
    encoding, offset = sniff_encoding(body[:3])
    nul = body.find(b"\0") if encoding == "utf-8" else -1
    if nul >= 0:  # UTF-16 without a BOM, or a binary file
        raise UsageError(f"{name}: a NUL byte at byte {nul}; {_ENCODINGS}")
    try:
        return body[offset:].decode(encoding)
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{name}: not {encoding.upper()[:6]} text at byte {offset + err.start}; {_ENCODINGS}"
        ) from None


def _rows(name: str, text: str) -> list[list[str]]:
    try:
        return list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as err:
        raise UsageError(f"{name}: not a CSV rating sheet ({err})") from None


def parse_sheet(name: str, body: bytes, key: dict[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """{rater: {item: {criterion: score}}} of one returned sheet; blank scores are not rated.

    A file is one rater's sheet: every row names the same rater, and a file named as exported
    (`sheet-<rater>.csv`, or `ratings-<rater>.csv` from the HTML page) names that rater too.
    Every bad value is a `UsageError` naming the file, the row and the column."""
    rows = _rows(name, sheet_text(name, body))
    criteria = key["criteria"]
    if not rows or rows[0][: len(FIXED_COLUMNS)] != FIXED_COLUMNS or not set(criteria) <= set(rows[0]):
        raise UsageError(f"{name}: row 1: the header must be {','.join(FIXED_COLUMNS + criteria)}")
    header = rows[0]
    if (i := repeated(header)) is not None:  # the last copy's scores would be kept in silence
        raise UsageError(f"{name}: row 1, column {i + 1}: the header names {short(header[i], 40)} twice")
    named = _FILE_RATER.fullmatch(Path(name).name)
    file_rater = named.group(1) if named and named.group(1) in key["raters"] else None
    rater_row = 0
    scores: dict[str, dict[str, int]] = {}
    for n, row in enumerate(rows[1:], start=2):
        if not any(v.strip() for v in row):
            continue
        rec = dict(zip(header, row))
        item, rater = rec.get("item", "").strip(), rec.get("rater", "").strip()
        at = f"{name}: row {n}"
        if not rater:
            raise UsageError(f"{at}, column rater: missing rater")
        if rater not in key["raters"]:
            raise UsageError(f"{at}, column rater: unknown rater {short(rater)}; exported: {', '.join(key['raters'])}")
        if file_rater is None:
            file_rater, rater_row = rater, n
        elif rater != file_rater:
            whose = f"row {rater_row}" if rater_row else "its file name"
            raise UsageError(
                f"{at}, column rater: rater {short(rater)}, but this file is {file_rater}'s sheet ({whose}); "
                "one file per rater"
            )
        if item not in key["items"]:
            raise UsageError(f"{at}, column item: unknown item {short(item)}")
        if item in scores:
            raise UsageError(f"{at}, column item: duplicate row for item {short(item)} and rater {short(rater)}")
        scores[item] = {}
        for c in criteria:
            raw = (rec.get(c) or "").strip()
            if raw and raw not in _SCORE_TEXT:
                raise UsageError(f"{at}, column {c}: score {short(raw, 40)} is not one of 1-5")
            if raw:
                scores[item][c] = _SCORE_TEXT[raw]
    return {file_rater: scores} if file_rater is not None and scores else {}


def rounds(store: Store, tenant: str, sweep_id: str) -> dict[str, dict[str, Any]]:
    """Every exported rating round of the sweep: round id -> its key (round "0": the layout before rounds)."""
    out = {}
    legacy = paths.rating_round_key(tenant, sweep_id, paths.LEGACY_ROUND, paths.RATINGS_KEY_FILE)
    if store.exists(legacy):
        out[paths.LEGACY_ROUND] = store.read_json(legacy)
    prefix = paths.rating_rounds_prefix(tenant, sweep_id)
    for k in store.list(prefix):
        round_id, _, rest = k[len(prefix) :].partition("/")
        if rest == paths.RATINGS_KEY_FILE and round_id.isdigit():
            out[round_id] = store.read_json(k)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def next_round(store: Store, tenant: str, sweep_id: str) -> str:
    """The id of the sweep's next rating round: one past the last."""
    return str(max((int(r) for r in rounds(store, tenant, sweep_id)), default=0) + 1)


def load_sheets(store: Store, tenant: str, sweep_id: str, round_id: str) -> dict[str, dict[str, dict[str, int]]]:
    """rater -> item -> {criterion: score}, from every sheet imported into the round."""
    sheets = {}
    for k in store.list(paths.rater_sheets_prefix(tenant, sweep_id, round_id)):
        doc = store.read_json(k)
        sheets[doc["rater"]] = doc["scores"]
    return sheets


def pooled(store: Store, tenant: str, sweep_id: str) -> tuple[dict[str, Any] | None, dict[str, dict]]:
    """(one key over every round, rater -> item -> scores over every round): the report pools the rounds,
    each item with its own cell (item ids carry their round, so no two rounds share one); None: no export."""
    keys = rounds(store, tenant, sweep_id)
    if not keys:
        return None, {}
    key: dict[str, Any] = {"criteria": [], "raters": [], "items": {}}
    sheets: dict[str, dict] = {}
    for round_id, k in keys.items():
        key["criteria"] += [c for c in k["criteria"] if c not in key["criteria"]]
        key["raters"] += [r for r in k["raters"] if r not in key["raters"]]
        key["items"].update(k["items"])
        for rater, scores in load_sheets(store, tenant, sweep_id, round_id).items():
            sheets.setdefault(rater, {}).update(scores)
    return key, sheets


def round_of(name: str, body: bytes, keys: dict[str, dict], sweep_id: str) -> str:
    """The round a returned sheet belongs to, from its item ids (`<round>-i…`; an id without a round is round
    "0"'s): the first that names an exported round (the sheet's rows are then checked against its key); a
    sheet none of whose items does is one line naming the round of its first."""
    rows = _rows(name, sheet_text(name, body))
    column = rows[0].index("item") if rows and "item" in rows[0] else None
    items = [r[column].strip() for r in rows[1:] if column is not None and len(r) > column and r[column].strip()]
    if not items:
        raise UsageError(f"{name}: no rated rows (a sheet holds its header and one row per item)")
    named = [item.split("-", 1)[0] if "-" in item else paths.LEGACY_ROUND for item in items]
    round_id = next((r for r in named if r in keys), named[0])
    if round_id not in keys:
        exported = ", ".join(keys) or "none"
        raise UsageError(
            f"{name}: its items are of rating round {short(round_id, 40)}, which sweep {sweep_id} never exported "
            f"(rounds: {exported})"
        )
    return round_id


def read_sheet_file(path: Path) -> tuple[str, bytes]:
    """(name, bytes) of a returned sheet on disk, its size checked before it is read and the read itself capped
    (a pipe or a device reports size 0: /dev/zero was read until memory ran out)."""
    limit_mb = settings.get("rating_sheet_max_mb")
    limit = int(limit_mb * 2**20)
    try:
        size = path.stat().st_size
        if size <= limit:
            with path.open("rb") as f:
                body = f.read(limit + 1)
            if len(body) <= limit:
                return str(path), body
            size = len(body)
        raise UsageError(
            f"{path}: {'more than ' if size == limit + 1 else ''}{size:,} bytes, over the limit of {limit_mb} MiB "
            "for a rating sheet (DECODEBENCH_RATING_SHEET_MAX_MB)"
        )
    except OSError as err:
        raise UsageError(f"{path}: cannot read the rating sheet ({err.strerror or err})") from None


def import_sheets(
    store: Store, tenant: str, sweep_id: str, files: list[tuple[str, bytes]]
) -> dict[tuple[str, str], tuple[int, str | None]]:
    """Validate every file against its round's key, then store one sheet per rater and round (a rater's new
    sheet of a round replaces theirs of that round; no round's sheet touches another's).

    Returns (round, rater) -> (items in the sheet, the source of the sheet it replaced, or None)."""
    keys = rounds(store, tenant, sweep_id)
    if not keys:
        raise UsageError(f"sweep {sweep_id} has no exported rating sheets; run `decodebench rate export` first")
    merged: dict[tuple[str, str], tuple[str, dict]] = {}
    for name, body in files:
        round_id = round_of(name, body, keys, sweep_id)
        for rater, scores in parse_sheet(name, body, keys[round_id]).items():
            if (round_id, rater) in merged:
                theirs = merged[round_id, rater][0]
                raise UsageError(f"{name}: rater {rater!r} also returned {theirs} in round {round_id}: duplicate sheet")
            merged[round_id, rater] = (name, scores)
    out = {}
    for (round_id, rater), (name, scores) in merged.items():
        sheet_key = paths.rater_sheet_key(tenant, sweep_id, round_id, rater)
        replaced = store.read_json(sheet_key).get("source", "?") if store.exists(sheet_key) else None
        store.write_json(sheet_key, {"rater": rater, "source": name, "scores": scores})
        out[round_id, rater] = (len(scores), replaced)
    return out


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
    """Studentised bootstrap interval over items of the mean score (each item with all its scores), inside the
    scale (`SCORES`); where every score is at one end of it, the exact interval of none seen off it (`within_scale`)."""
    from controller.metrics import ratio
    from controller.report.stats.bootstrap_t import CI_LEVEL, studentized, values_of
    from controller.report.stats.shares import within_scale

    sums = np.array([[sum(s), len(s)] for s in per_item], dtype=float)
    if len(per_item) < 2:
        return math.nan, math.nan
    interval = studentized(sums, values_of(ratio), n_boot=N_BOOT, rng=rng, is_ratio=True)
    scale = (float(min(SCORES)), float(max(SCORES)))
    return within_scale(interval, len(per_item), CI_LEVEL, scale) or (math.nan, math.nan)


def _alpha_interval(matrix: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """95% percentile bootstrap of α over items (columns); NaN where fewer than half the draws define it."""
    n = matrix.shape[1]
    if matrix.shape[0] < 2 or n < 2:
        return math.nan, math.nan
    draws = [alpha(matrix[:, idx]) for idx in rng.integers(0, n, size=(N_BOOT_ALPHA, n))]
    finite = [a for a in draws if not math.isnan(a)]
    if len(finite) < N_BOOT_ALPHA / 2:
        return math.nan, math.nan
    lo, hi = np.percentile(finite, [2.5, 97.5])
    return float(lo), float(hi)


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
            row[f"rating_{c}_n"] = len(per_item)
            row[f"rating_{c}_alpha"] = alpha(matrix)
            alo, ahi = _alpha_interval(matrix, np.random.default_rng([seed, len(rows), 1]))
            row[f"rating_{c}_alpha_ci_low"], row[f"rating_{c}_alpha_ci_high"] = alo, ahi
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
    """The rating columns of a sweep's imported sheets, every rating round pooled; None before any import."""
    key, sheets = pooled(store, tenant, sweep_id)
    return rating_columns(key, sheets) if key is not None and sheets else None
