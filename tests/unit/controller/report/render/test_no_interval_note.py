"""A summary without intervals says why in every format a reader sees: Markdown, HTML and the terminal."""

from __future__ import annotations

import json

import pytest

from controller.cli.table import echo_summary
from controller.report.compute.aggregate import summarize
from controller.report.render.format import summary_markdown
from controller.report.render.html import render_html
from controller.report.render.write import render
from tests.support.report import make_sweep


@pytest.mark.parametrize(
    ("n_prompts", "n_boot", "why"),
    [(5, 200, "the smallest cell has 5 prompts, fewer than the 8 they need"), (8, 0, "--n-boot 0")],
)
def test_a_summary_without_intervals_says_why_in_markdown_html_and_the_terminal(n_prompts, n_boot, why, capsys):
    """Below 8 prompts summary.md and the terminal were silent (only report.html said it), and report.html blamed
    the prompts where the report had run with --n-boot 0."""
    data = make_sweep(n_prompts=n_prompts, shard_size=n_prompts)
    summary = summarize(data, n_boot=n_boot)
    assert summary.attrs["ci"] is None
    assert "No intervals and no paired comparisons" in summary_markdown(summary, data) and why in summary_markdown(
        summary, data
    )
    assert why in render_html(summary, data)
    assert why in json.loads(render("json", summary, data))["no_ci"]
    echo_summary(summary)
    assert why in capsys.readouterr().err


def test_a_summary_with_intervals_has_no_such_note():
    data = make_sweep(n_prompts=8)
    summary = summarize(data, n_boot=100)
    assert summary.attrs["no_ci"] is None
    assert "No intervals" not in summary_markdown(summary, data)
