"""The paired comparisons' table, as Markdown and HTML, and the notes of comparisons, a sweep's own and `report
--compare`'s (the statistics: controller.report.stats.paired)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from controller.report.compute.columns import PAIRED_COLUMN
from controller.report.load.jobs import MIN_CI_PROMPTS
from controller.report.stats.paired import BASELINE_COLUMN, least_p, on_first_generations

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
    f" {FIRSTS} Of each prompt's first generation in both cells: a corpus metric (distinct-n, self-BLEU, Zipf) moves "
    "with how many generations a cell has, and these two cells have different numbers a prompt."
)
COMPARE_NOTE = (
    "Δ: B − A, two sweeps' numbers with no interval or test: no two matched cells hold the same prompts (ids and "
    f"texts) in both sweeps with intervals ({MIN_CI_PROMPTS} prompts or more, --n-boot not 0). To test a difference, "
    "run both sweeps on the same prompts, or both sides in one sweep (docs/reports.md#comparing-sweeps).\n"
)
PAIRED_NOTE = (
    "Δ: B − A. *: the paired test over the prompts both sweeps hold alike (paired_prompts; each prompt's generations "
    "in A against its generations in B, as a sweep compares its own cells) finds a difference, Holm-adjusted p below "
    "0.05 over the whole table. Intervals and p-values are in the csv (<metric>_diff_ci_low, _ci_high, _p, _p_holm)."
    " A row with an empty paired_prompts was not tested: its cells' prompts differ (docs/reports.md#comparing-sweeps)."
)
FIRSTS_TESTED = (
    f" {FIRSTS}: tested on each prompt's first generation, as the two cells hold different numbers a prompt (a corpus"
    " metric moves with that number, and so does its Δ)."
)


def untested_note(shared: Mapping[str, int] | None) -> str:
    """`report --compare`'s note where no pair was tested: COMPARE_NOTE, or where the sweeps hold enough prompts
    alike but not the same set (`shared`: the counts `compare_sweeps` keeps under `columns.PROMPTS_ATTR`), why those
    were not paired."""
    if not shared or shared["alike"] < MIN_CI_PROMPTS or shared["a"] == shared["b"] == shared["alike"]:
        return COMPARE_NOTE
    return (
        f"Δ: B − A, two sweeps' numbers with no interval or test: the sweeps hold {shared['alike']} prompts alike, "
        f"but A has {shared['a']} and B {shared['b']}, and a cell's metrics are over all its prompts, so a test on the "
        f"{shared['alike']} would not be of the Δ shown. To test a difference, run both sweeps on the same prompts "
        "(the same file and limit), or both sides in one sweep (docs/reports.md#comparing-sweeps).\n"
    )


def across_note(firsts: bool, floor: str | None) -> str:
    """`report --compare`'s note where its pairs were tested: what * means, † where a row has one (`firsts`), and
    `floor_note`'s where it has one."""
    return PAIRED_NOTE + (FIRSTS_TESTED if firsts else "") + (f" {floor}" if floor else "")


def floor_note(frame: pd.DataFrame, level: float = 0.05) -> str | None:
    """Why no difference of `frame`'s comparisons can be found at `level`, where that is so: with G prompts a
    test that swaps them gives p >= 2 / 2^G (`paired.least_p`), and Holm multiplies the table's least p by its
    number of p-values. G: the most prompts a row was compared over (`report --compare`: `paired_prompts`; a
    sweep's own table: the fewer of its two cells' `n_prompts`, at least the prompts they share). None where a
    row could reach `level`, or without p-values."""
    tests = int(sum(np.isfinite(pd.to_numeric(frame[c], errors="coerce")).sum() for c in frame.columns
                    if c.endswith("_diff_p")))  # fmt: skip
    if PAIRED_COLUMN in frame.columns:
        counts = pd.to_numeric(frame[PAIRED_COLUMN], errors="coerce").dropna()
    elif {BASELINE_COLUMN, "cell", "n_prompts"} <= set(frame.columns):
        n = dict(zip(frame["cell"], frame["n_prompts"]))
        counts = pd.Series(
            [min(n[c], n[b]) for c, b in zip(frame["cell"], frame[BASELINE_COLUMN]) if isinstance(b, str) and b in n]
        )
    else:
        return None
    if not tests or counts.empty or tests * least_p(G := int(counts.max())) < level:
        return None
    needed = math.floor(1 + math.log2(tests / level)) + 1  # the least G with tests * 2^(1 - G) < level
    which = "no difference" if tests * least_p(G, mid=True) >= level else "no difference but a 0/1 share's"
    return (
        f"With {G} prompts {which} here can reach p < {level:g}, however clear its interval: the tests swap the two "
        f"cells' generations prompt by prompt, 2^{G} arrangements, so a p is at least 2/2^{G} = {least_p(G):.2g} (a "
        f"0/1 share's mid-p, half that), and Holm's adjustment multiplies the least by the table's {tests} p-values. "
        f'{needed} prompts or more would let one through (docs/reports.md, "How few prompts can decide").'
    )


def comparison_table(
    summary, fmt: Callable, label: Callable, column_format: Callable[[list], Callable[[Any], str]]
) -> list[tuple[str, list[str]]] | None:
    """("cell", headers), then (row label, cells) for the rows with a baseline; None without comparisons.

    `fmt`, `label` and `column_format` come from the caller (controller.report.render.format), as for the ratings
    table: each Δ column's differences and interval ends in one format, `column_format`'s of the column's values
    (as the summary's columns: not `1.56e-04` beside `-0.057`); the p-values with `fmt`."""
    if BASELINE_COLUMN not in summary.columns or not summary[BASELINE_COLUMN].notna().any():
        return None
    metrics = [m for m in COMPARED if f"{m}_diff" in summary.columns and summary[f"{m}_diff"].notna().any()]
    labels = {row["cell"]: label(row) for _, row in summary.iterrows()}
    table: list[tuple[str, list[str]]] = [("cell", ["baseline", *[f"Δ {m}" for m in metrics]])]
    ends = ("_diff", "_diff_ci_low", "_diff_ci_high")
    column = {
        m: column_format([v for e in ends if f"{m}{e}" in summary for v in summary[f"{m}{e}"].tolist()])
        for m in metrics
    }
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
            low, high = (column[m](row.get(f"{m}{e}")) for e in ends[1:])
            text = f"{column[m](diff)} [{low}, {high}]"
            if np.isfinite(p):
                text += f" p={fmt(p)}" + ("*" if p < 0.05 else "")
            cells.append(text + (f" {FIRSTS}" if m in firsts else ""))
        table.append((labels[row["cell"]], cells))
    return table


def note(table: list[tuple[str, list[str]]], floor: str | None = None) -> str:
    """The table's note, with what † means where a cell of it has one, and `floor_note`'s where it has one."""
    marked = any(v.endswith(FIRSTS) for _, cells in table[1:] for v in cells)
    return NOTE + (FIRSTS_NOTE if marked else "") + (f" {floor}" if floor else "")


def comparison_markdown(table: list[tuple[str, list[str]]] | None, floor: str | None = None) -> list[str]:
    if table is None:
        return []
    (_, header), *rows = table
    lines = ["## Paired comparisons", "", note(table, floor), "", "| cell | " + " | ".join(header) + " |"]
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


def comparison_html(table: list[tuple[str, list[str]]] | None, floor: str | None = None) -> str:
    """The HTML report's section, collapsed behind a toggle (<details>); empty without comparisons."""
    from html import escape as e

    if table is None:
        return ""
    return (
        f'<details id="comparisons"><summary>Paired comparisons against each cell\'s baseline ({len(table) - 1} cells)'
        f'</summary><p class="small">{e(note(table, floor))}</p>'
        f'<div class="scroll">{labelled_table_html(table)}</div></details>'
    )
