"""One number format per metric column in every table people read (issue 28): summary.md's Markdown
tables, the HTML table and the terminal's table format a column alike, so rep_4 never shows `0.00`,
`2.58e-04` and `0.786` in one column."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from controller.cli.table import summary_columns
from controller.report.render.format import ColumnFormat, decimals, markdown_table
from controller.report.render.summary_table import summary_table

pytestmark = pytest.mark.pure


def _summary() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model": ["tiny", "tiny", "tiny"],
            "strategy": ["greedy", "top_p", "typical"],
            "params": ["{}", '{"p":0.9}', '{"p":0.95}'],
            "n_generations": [12, 36, 36],
            "tokens_per_s": [1234.56, 98.7, 1500.0],
            "rep_4": [0.0, 2.58e-4, 0.786],
            "rep_4_ci_low": [0.0, 1.2e-4, 0.7012],
            "rep_4_ci_high": [0.0, 4.1e-4, 0.8123],
            "self_bleu_4": [0.00258, 0.0001, math.nan],
            "perplexity": [12.345, 8.0, 9.5],
        }
    )


def _column(md: str, header: str) -> list[str]:
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("|")]
    at = lines[0].index(header)
    return [row[at] for row in lines[2:]]


def test_a_markdown_column_has_one_format_whatever_its_magnitudes():
    md = markdown_table(_summary())
    assert _column(md, "rep_4") == ["0.000", "0.000", "0.786"]  # not 0.00, 2.58e-04, 0.786
    assert _column(md, "self_bleu_4") == ["0.00258", "0.00010", ""]  # a small metric keeps 3 digits; empty is empty
    assert _column(md, "tok/s") == ["1235", "99", "1500"]
    assert _column(md, "perplexity") == ["12.35", "8.00", "9.50"]
    assert _column(md, "n") == ["12", "36", "36"]
    full = markdown_table(_summary(), ["model", "strategy", "params", "rep_4"], with_ci=True)
    assert _column(full, "rep_4") == ["0.000 [0.000, 0.000]", "0.000 [0.000, 0.000]", "0.786 [0.701, 0.812]"]


def test_the_terminal_markdown_and_html_tables_format_a_column_alike():
    summary = _summary()
    terminal = summary_columns(summary)
    md = markdown_table(summary)
    html = summary_table(summary)
    for header, column in (("rep_4", "rep_4"), ("tok/s", "tokens_per_s"), ("perplexity", "perplexity")):
        plain = [re.sub(r" (±|\+).*", "", t).replace(",", "") for t in terminal[header]]
        assert plain == _column(md, header), header
        for value in plain:
            assert f">{value}</td>" in html, (column, value)


def test_the_decimals_follow_the_largest_magnitude_independently_computed():
    for values in ([0.0, 2.58e-4, 0.786], [12.3, 4.0], [180.0], [1500.0, 2.0], [0.00258, 0.0001], [4e-9]):
        top = max(abs(v) for v in values)
        expected = (
            0 if top >= 1000 else 1 if top >= 100 else 2 if top >= 10 else 3 if top >= 0.01
            else min(6, -int(math.floor(math.log10(top))) + 2)
        )  # fmt: skip
        assert decimals(values) == expected, values
    assert ColumnFormat(_summary())("n_generations", 36.0) == "36"


def test_a_task_sweeps_accuracy_is_in_the_overview_the_pipe_and_the_terminal():
    """A task sweep's accuracy (exact_match, pass@k, maj@k) was in the terminal's table but not in summary.md's
    overview nor in the table `run` and `report` print on a pipe, which showed only the concise text metrics: the
    task example printed tokens/s and mean length and none of its accuracy."""
    summary = _summary().assign(
        mean_length=[10.0, 11.0, 12.0],
        exact_match=[0.984, 0.414, 0.5],
        **{"pass@8": [math.nan, 0.984, 0.9], "maj@8": [math.nan, 0.906, 0.8], "answered": [1.0, 0.9, 0.95]},
    )
    header = markdown_table(summary).splitlines()[0]
    assert header.index("exact_match") < header.index("pass@8") and header.index("maj@8") < header.index("| len |")
    assert "answered" not in header  # not an accuracy: in summary.md's "All columns"
    assert _column(markdown_table(summary), "exact_match") == ["0.984", "0.414", "0.500"]
    terminal = list(summary_columns(summary))
    assert terminal.index("exact_match") < terminal.index("rep_4")  # the terminal's: accuracy first, as before


def test_a_comparisons_delta_column_has_one_format_whatever_its_magnitudes():
    """The paired comparisons' table formatted each value alone: `1.56e-04 [-0.020, 0.021]` beside
    `-0.057 [-0.083, -0.029]` in one column, `-0.093 [-0.177, -3.74e-04]` in one cell."""
    from controller.report.render.comparisons import comparison_table
    from controller.report.render.format import column_format, fmt

    frame = pd.DataFrame(
        {
            "cell": ["a", "b", "c"],
            "baseline": [None, "a", "a"],
            "rouge_l_diff": [math.nan, 1.56e-4, -0.057],
            "rouge_l_diff_ci_low": [math.nan, -0.020, -0.083],
            "rouge_l_diff_ci_high": [math.nan, 0.021, -3.74e-4],
            "rouge_l_diff_p_holm": [math.nan, 1.0, 0.009],
        }
    )
    table = comparison_table(frame, fmt, lambda row: row["cell"], column_format)
    assert table is not None
    (_, header), *rows = table
    assert header == ["baseline", "Δ rouge_l"]
    assert [cells[1] for _, cells in rows] == ["0.000 [-0.020, 0.021] p=1.00", "-0.057 [-0.083, -0.000] p=0.009*"]
