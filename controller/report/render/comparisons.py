"""The paired comparisons' table, as Markdown and HTML (the statistics: controller.report.stats.paired)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from controller.report.stats.paired import BASELINE_COLUMN, on_first_generations

COMPARED = [
    "exact_match",
    "mean_length",
    "rep_4",
    "diversity",
    "distinct_2",
    "self_bleu_4",
    "perplexity",
    "coherence",
    "bleu",
    "rouge_l",
    "mauve",
]
NOTE = (
    "Each cell against its baseline, on the prompts both share (cells are paired: every strategy and model "
    "draws the same random numbers for a prompt and seed). Δ = cell − baseline [95% paired interval over "
    "prompts]; p: Holm-adjusted over the whole table (* below 0.05). Every metric's columns are in summary.csv."
)
FIRSTS = "†"
FIRSTS_NOTE = (
    f" {FIRSTS} Of each prompt's first generation in both cells: a corpus metric (distinct-n, self-BLEU) moves with "
    "how many generations a cell has, and these two cells have different numbers a prompt."
)


def comparison_table(summary, fmt: Callable, label: Callable) -> list[tuple[str, list[str]]] | None:
    """("cell", headers), then (row label, cells) for the rows with a baseline; None without comparisons.

    `fmt` and `label` come from the caller (controller.report.render.format), as for the ratings table."""
    if BASELINE_COLUMN not in summary.columns or not summary[BASELINE_COLUMN].notna().any():
        return None
    metrics = [m for m in COMPARED if f"{m}_diff" in summary.columns and summary[f"{m}_diff"].notna().any()]
    labels = {row["cell"]: label(row) for _, row in summary.iterrows()}
    table: list[tuple[str, list[str]]] = [("cell", ["baseline", *[f"Δ {m}" for m in metrics]])]
    for _, row in summary.iterrows():
        if row.get(BASELINE_COLUMN) is None or not isinstance(row[BASELINE_COLUMN], str):
            continue
        cells = [labels.get(row[BASELINE_COLUMN], row[BASELINE_COLUMN])]
        firsts = on_first_generations(row)
        for m in metrics:
            diff, p = row[f"{m}_diff"], row[f"{m}_diff_p_holm"]
            if not np.isfinite(diff):
                cells.append("")
                continue
            text = f"{fmt(diff)} [{fmt(row[f'{m}_diff_ci_low'])}, {fmt(row[f'{m}_diff_ci_high'])}]"
            if np.isfinite(p):
                text += f" p={fmt(p)}" + ("*" if p < 0.05 else "")
            cells.append(text + (f" {FIRSTS}" if m in firsts else ""))
        table.append((labels[row["cell"]], cells))
    return table


def note(table: list[tuple[str, list[str]]]) -> str:
    """The table's note, with what † means where a cell of it has one."""
    marked = any(v.endswith(FIRSTS) for _, cells in table[1:] for v in cells)
    return NOTE + (FIRSTS_NOTE if marked else "")


def comparison_markdown(table: list[tuple[str, list[str]]] | None) -> list[str]:
    if table is None:
        return []
    (_, header), *rows = table
    lines = ["## Paired comparisons", "", note(table), "", "| cell | " + " | ".join(header) + " |"]
    lines.append("|---|---|" + "---:|" * (len(header) - 1))
    lines += ["| " + " | ".join(v.replace("|", "\\|") for v in [label, *cells]) + " |" for label, cells in rows]
    return [*lines, ""]


def labelled_table_html(table: list[tuple[str, list[str]]]) -> str:
    """A `(label, cells)` table (its first row the header) as an HTML table, every value escaped."""
    from html import escape as e

    (_, header), *rows = table
    head = "".join(f'<th class="t">{e(h)}</th>' for h in ["cell", *header])
    body = "".join(
        "<tr>" + "".join(f'<td class="t">{e(v)}</td>' for v in [label, *cells]) + "</tr>" for label, cells in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def comparison_html(table: list[tuple[str, list[str]]] | None) -> str:
    """The HTML report's section, collapsed behind a toggle (<details>); empty without comparisons."""
    from html import escape as e

    if table is None:
        return ""
    return (
        f'<details id="comparisons"><summary>Paired comparisons against each cell\'s baseline ({len(table) - 1} cells)'
        f'</summary><p class="small">{e(note(table))}</p>'
        f'<div class="scroll">{labelled_table_html(table)}</div></details>'
    )
