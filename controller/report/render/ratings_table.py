"""The human ratings' table in the report, as Markdown rows and HTML (the scores: controller.report.ratings.scores)."""

from __future__ import annotations

import pandas as pd

from controller.report.render.comparisons import labelled_table_html

MIN_ALPHA_ITEMS = 10  # below this, α is shown marked "too few items"


def _alpha_text(row, c: str, fmt) -> str:
    value = row.get(f"rating_{c}_alpha")
    if value is None or pd.isna(value):
        return "α –"
    text = f"α {fmt(value)}"
    lo, hi = row.get(f"rating_{c}_alpha_ci_low"), row.get(f"rating_{c}_alpha_ci_high")
    if lo is not None and not pd.isna(lo):
        text += f" [{fmt(lo)}, {fmt(hi)}]"
    n = row.get(f"rating_{c}_n")
    if n is not None and not pd.isna(n) and n < MIN_ALPHA_ITEMS:
        text += " (too few items)"
    return text


def _n_text(row, c: str) -> str:
    n = row.get(f"rating_{c}_n")
    return "" if n is None or pd.isna(n) else f" · n {int(n)}"


def rating_table(summary: pd.DataFrame, fmt, label) -> list[tuple[str, list[str]]] | None:
    """("cell", criteria), then (row label, ["mean [low, high] · n items · α value [low, high]" per
    criterion]) of the rated rows; α is marked "(too few items)" below MIN_ALPHA_ITEMS items.

    `fmt` is controller.report.render.format's (passed in: format imports this module), `label` a row's cell
    label (`controller.report.render.labels.labeller`)."""
    criteria = [
        c[len("rating_") : -len("_alpha")] for c in summary.columns if c.startswith("rating_") and c.endswith("_alpha")
    ]
    if not criteria:
        return None
    table = [("cell", criteria)]
    for _, row in summary.iterrows():
        if all(pd.isna(row[f"rating_{c}"]) for c in criteria):
            continue
        cells = [
            f"{fmt(row[f'rating_{c}'])} [{fmt(row[f'rating_{c}_ci_low'])}, {fmt(row[f'rating_{c}_ci_high'])}]"
            f"{_n_text(row, c)} · {_alpha_text(row, c, fmt)}"
            for c in criteria
        ]
        table.append((label(row), cells))
    return table


RATINGS_NOTE = (
    "Human ratings (1-5): mean of every score of the cell's rated items, 95% bootstrap interval over items; "
    "n: the cell's rated items; Krippendorff's α (ordinal) between raters with its 95% bootstrap interval over "
    f"items, marked (too few items) below {MIN_ALPHA_ITEMS} items, where it says little; "
    "the reference row is the control."
)


def ratings_html(table: list[tuple[str, list[str]]] | None) -> str:
    """The HTML report's section from `rating_table`; empty without ratings."""
    from html import escape as e

    if table is None:
        return ""
    return f'<h2 id="ratings">Human ratings</h2><p class="small">{e(RATINGS_NOTE)}</p>{labelled_table_html(table)}'
