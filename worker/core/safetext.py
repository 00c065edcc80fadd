"""Text that goes back to a reader, made harmless: one function per destination.

- `terminal(text)`: a user-supplied string printed to a terminal (a sweep or model name, a
  cell, a failure reason, a path). Control characters (C0, DEL, C1: ESC and so CSI, OSC and
  OSC 8 sequences, BEL, backspace, CR, newline) and the invisible format characters that
  reorder or hide text (bidirectional overrides, zero-width) are shown as escapes (`\\x1b`,
  `\\n`, `\\u202e`) instead of being interpreted. Always, on a TTY too: click strips only CSI
  colours and only when piped.
- `csv_cell(value)`: one CSV cell that a spreadsheet will open (OWASP's CSV-injection rule):
  a *string* that starts with `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading
  `'`, so it is shown as text and never evaluated as a formula. Numbers (ints, floats) are left
  alone: a `-0.5` the project computed stays a number; a `-0.5` typed by a user into a prompt
  becomes `'-0.5`, text, which is what it was. The HTML rating sheet's export does the same in
  JavaScript (`controller/report/assets/rating.js`, `cell()`).
- `markdown(text)`: a user-supplied string in a Markdown table cell: `&`, `<` and `>` become
  entities (no raw HTML such as `<img onerror=...>` reaches a Markdown renderer), `|` is
  escaped, newlines become spaces, and control characters are shown as by `terminal`.

Nothing else of decodebench is imported, so both command lines and both planes use these.
"""

from __future__ import annotations

import unicodedata
from typing import Any

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Unicode format characters (category Cf) that reorder or hide text; the soft hyphen is harmless.
_FORMAT_OK = {"\u00ad"}
CSV_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def _visible(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _hidden(ch: str) -> bool:
    if ch.isprintable() or ch == " ":
        return False
    category = unicodedata.category(ch)
    # Cc: control characters; Cf: format characters (bidi overrides, zero-width joiners...);
    # Zl/Zp: line and paragraph separators, which some terminals and editors break lines on.
    return category in ("Cc", "Zl", "Zp") or (category == "Cf" and ch not in _FORMAT_OK)


def terminal(text: Any) -> str:
    """`str(text)` with every control or invisible format character shown as an escape (see the module doc)."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(_visible(ch) if _hidden(ch) else ch for ch in text)


def terminal_lines(text: str) -> str:
    """`terminal` of each line of a block that decodebench built itself, keeping its newlines."""
    return "\n".join(terminal(line) for line in text.split("\n"))


def csv_cell(value: Any) -> Any:
    """A spreadsheet-safe CSV cell: a string starting with a formula trigger gets a leading `'` (OWASP)."""
    if isinstance(value, str) and value.startswith(CSV_TRIGGERS):
        return "'" + value
    return value


def csv_row(values: list[Any]) -> list[Any]:
    """`csv_cell` of every value of a row."""
    return [csv_cell(v) for v in values]


def markdown(text: Any) -> str:
    """A Markdown table cell: HTML escaped, `|` escaped, one line, control characters visible."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("|", "\\|").replace("\r\n", " ").replace("\n", " ")
    return terminal(text)
