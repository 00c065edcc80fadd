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
    assert "±" in lines[1] or "/-" in lines[1]  # intervals as ±h, or +up/-down where lopsided
    if width == 80:
        assert "more column(s) in the report" in lines[-1]


def test_one_number_format_per_column(summary):
    assert decimals([0.0, 2.58e-4, 0.786]) == 3 and decimals([12.3, 4.0]) == 2 and decimals([180.0]) == 1
    lines = render(summary, 250)
    assert "rep_4" in lines[0] and not any("e-0" in line or "e+0" in line for line in lines), lines


def test_a_lopsided_interval_shows_both_sides_not_a_half_width():
    """rep_4 at 0.000 with [0, 0.369] read `0.000 ±0.185`: as if it reached -0.185 and stopped at 0.185."""
    from controller.cli.table import _spread

    assert _spread(0.0, 0.0, 0.369, 3) == " +0.369/-0.000"
    assert _spread(65.01, 40.0, 120.5, 2) == " +55.49/-25.01"
    assert _spread(1.0, 0.9, 1.1, 3) == " ±0.100"
    assert _spread(1.0, 1.0, 1.0, 3) == "" and _spread(1.0, float("nan"), 2.0, 3) == ""
