"""A command line's refusal, checked as a user reads it: exit 2, one line on stderr, no traceback."""

from __future__ import annotations


def refused(result, *expected: str) -> str:
    """The one line of a refusal, checked: exit 2, one line on stderr, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and len(lines[0]) < 400, lines[0]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]
