"""The summary at a terminal (issue 28, item 3): a rich table fitted to the width, columns
dropped from the least important, one number format per metric column, intervals as ±."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from controller.cli.table import decimals, print_summary
from controller.report.compute.aggregate import summarize
from tests.support.report import make_sweep


@pytest.fixture(scope="module")
def summary():
    data = make_sweep(
        seeds=(0, 1),
        n_prompts=8,
        cells=[
            ("austen-tiny", "greedy", {}),
            ("austen-tiny", "top_p", {"p": 0.8}),
            ("austen-tiny", "top_p", {"p": 0.95}),
        ],
    )
    return summarize(data, n_boot=20, n_boot_corpus=5)


def render(summary, width: int) -> list[str]:
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=width, highlight=False, color_system=None))
    return out.getvalue().rstrip("\n").splitlines()


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_table_fits_the_terminal_and_keeps_the_cell_and_speed(summary, width):
    lines = render(summary, width)
    assert all(len(line.rstrip()) <= width for line in lines), "\n".join(lines)
    header = lines[0].split()
    assert header[:2] == ["model", "strategy"] and "tok/s" in header
    assert any("top_p(p=0.8)" in line for line in lines) and any("top_p(p=0.95)" in line for line in lines)
    assert "±" in lines[1]  # intervals as ± half-width
    if width == 80:
        assert "more column(s) in the report" in lines[-1]


def test_one_number_format_per_column(summary):
    assert decimals([0.0, 2.58e-4, 0.786]) == 3 and decimals([12.3, 4.0]) == 2 and decimals([180.0]) == 1
    lines = render(summary, 250)
    assert "rep_4" in lines[0] and not any("e-0" in line or "e+0" in line for line in lines), lines
