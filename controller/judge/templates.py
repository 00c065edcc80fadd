"""The judge's prompt templates: versioned files in the repository (or a user's file), their hash recorded.

A template is a text file: the system message, a line `=== user ===`, then the user message. The
placeholders `{criterion}`, `{prompt}` and, pairwise, `{answer_a}` and `{answer_b}` (single:
`{answer}`) are replaced literally (no format mini-language: a brace in an answer is just a brace).
The sha256 of the file's bytes is the template's hash: it enters every request's cache key and is
recorded with every verdict, so a changed template never reuses an old verdict.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from worker.core.errors import UsageError

BUNDLED = {"pairwise": "pairwise-v1.txt", "single": "single-v1.txt"}
SEPARATOR = "=== user ==="
NEEDS = {"pairwise": ("{prompt}", "{answer_a}", "{answer_b}"), "single": ("{prompt}", "{answer}")}
MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Template:
    name: str  # the bundled file's name or the user's path
    system: str
    user: str
    sha256: str

    def messages(self, criterion: str, prompt: str, answers: tuple[str, ...]) -> list[dict[str, str]]:
        """The chat messages for one request: one answer (single) or answer A then B (pairwise)."""
        fields = {"{criterion}": criterion, "{prompt}": prompt}
        if len(answers) == 1:
            fields["{answer}"] = answers[0]
        else:
            fields["{answer_a}"], fields["{answer_b}"] = answers
        return [
            {"role": "system", "content": _fill(self.system, fields)},
            {"role": "user", "content": _fill(self.user, fields)},
        ]


def _fill(text: str, fields: dict[str, str]) -> str:
    """Each placeholder replaced once, left to right, so that an answer containing `{answer_b}` stays as written."""
    out, i = [], 0
    while i < len(text):
        hit = next(((k, v) for k, v in fields.items() if text.startswith(k, i)), None)
        if hit is None:
            out.append(text[i])
            i += 1
        else:
            out.append(hit[1])
            i += len(hit[0])
    return "".join(out)


def parse_template(name: str, body: bytes, mode: str) -> Template:
    """A template from a file's bytes; UsageError (one line) for one that the mode cannot use."""
    if len(body) > MAX_BYTES:
        raise UsageError(f"judge template {name}: over {MAX_BYTES // 1024} KiB")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"judge template {name}: not UTF-8") from None
    if SEPARATOR not in text:
        raise UsageError(f"judge template {name}: no line {SEPARATOR!r} between the system and the user message")
    system, user = (part.strip("\n") for part in text.split(SEPARATOR, 1))
    missing = [p for p in NEEDS[mode] if p not in system + user]
    if missing:
        raise UsageError(f"judge template {name}: a {mode} template needs {', '.join(missing)}")
    return Template(name=name, system=system, user=user, sha256=hashlib.sha256(body).hexdigest())


def load_template(mode: str, path: str | None = None) -> Template:
    """The user's template file, else the bundled versioned one of the mode."""
    if path is None:
        file = Path(__file__).with_name("templates") / BUNDLED[mode]
        return parse_template(BUNDLED[mode], file.read_bytes(), mode)
    try:
        body = Path(path).read_bytes()
    except OSError as err:
        raise UsageError(f"judge template {path}: cannot read it ({err.strerror or err})") from None
    return parse_template(path, body, mode)
