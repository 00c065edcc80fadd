"""Reading an answer from a generation: a sweep's `task:` section as small composable filters.

After lm-evaluation-harness's filters: `extract` is a pipeline, each filter applied to what the one
before it left (None, nothing found, ends it: the generation is unanswered), then `normalize` puts
the answer and every gold answer in one form before they are compared. The same filters serve every
task:

    task:
      extract: [first_line, {regex: "answer is (.*)"}, last_number]
      normalize: [case, whitespace, punctuation, numbers]    # the default: all four

- `{regex: PATTERN, group: 1, occurrence: first|last}`: the group of the first (or last) match;
  group 0 is the whole match, the default is 1 where the pattern has a group, else 0. Patterns run
  on RE2 (`google-re2`), a linear-time engine without backtracking, so no pattern a user writes can
  hang a report: `(a+)+$` costs the same linear scan as `a+$`. RE2 has no look-around and no
  backreferences; a pattern that uses them is refused at validation, in one line.
- `last_number`, `first_number`: the last (first) number, e.g. `-1,234.5`.
- `first_line`: the first line that is not blank.
- `choice_letter`: a choice's letter, (B), B) or a lone B, among the prompt's `choices` (A, B, ...
  for as many as it has; any capital letter where it has none); else the letter of the one choice
  whose text the generation contains. A gold letter is compared in the normal form (`b` is B where
  `case` is on).

Normalisation (each optional): `numbers` (a string that is one number, `1,000`, `+3.0`, `3.50`, `.5`,
`$12`, `1e16`, becomes its canonical decimal: `1000`, `3`, `3.5`, `0.5`, `12`, `10000000000000000`),
`case` (casefold), `punctuation` (each punctuation character a space, but a number in the text kept
whole: `-5`, `1,000.5`, canonical too where `numbers` is on), `whitespace` (trimmed, runs collapsed to
one space).
"""

from __future__ import annotations

import json
import re
import string
import unicodedata
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Annotated, Any, Literal

import re2
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

REGEX_MAX_CHARS = 1000  # a pattern's length at most
RE2_MAX_MEM = 8 << 20  # bytes RE2 may use for one compiled pattern
NORMALIZERS = ("case", "whitespace", "punctuation", "numbers")
NAMED = ("last_number", "first_number", "first_line", "choice_letter")

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
# One number, as `numbers` reads a whole answer: a `$` before it, an exponent after it (1e16, 2.5E-3; at most
# three digits, so that no text writes out a number of a billion digits).
_WHOLE_NUMBER = re.compile(rf"\$?(?:{_NUMBER.pattern})(?:[eE][-+]?\d{{1,3}})?")
# A number inside free text, which `punctuation` keeps whole: not part of a word or of a longer number (the
# hyphen of `10-20` is no sign).
_TEXT_NUMBER = re.compile(rf"(?<![\w.,$]){_WHOLE_NUMBER.pattern}(?![\w])")
_LETTER = re.compile(r"(?<![A-Za-z0-9])\(?([A-Z])(?:\)|\.|:|(?![A-Za-z0-9]))")


class RegexFilter(BaseModel):
    """`{regex: PATTERN, group: N, occurrence: first|last}`: a group of a match, on RE2."""

    model_config = ConfigDict(extra="forbid")

    regex: str = Field(min_length=1, max_length=REGEX_MAX_CHARS, description="An RE2 pattern (no look-around).")
    group: int | None = Field(
        default=None,
        strict=True,
        ge=0,
        description="The group to read (0: the whole match); default 1 where there is one, else 0.",
    )
    occurrence: Literal["first", "last"] = Field(default="first", description="Read the first or the last match.")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str) -> str:
        compiled(v)
        return v

    @model_validator(mode="after")
    def _has_group(self) -> RegexFilter:
        groups = compiled(self.regex).groups
        if self.group is not None and self.group > groups:
            raise ValueError(f"group {self.group} asked, but the pattern has {groups}")
        return self


Filter = Annotated[
    Annotated[Literal["last_number", "first_number", "first_line", "choice_letter"], Tag("named")]
    | Annotated[RegexFilter, Tag("regex")],
    Discriminator(lambda v: "named" if isinstance(v, str) else "regex"),  # one error: the branch written
    Field(description="A named filter, or {regex: PATTERN, group: N, occurrence: first|last}."),
]


class TaskSpec(BaseModel):
    """How an answer is read from a generation and compared with the prompt's gold `answer`."""

    model_config = ConfigDict(extra="forbid")

    extract: list[Filter] = Field(
        default_factory=list,
        max_length=16,
        description="Filters applied in order, each to what the previous one left; nothing found leaves the "
        "generation unanswered. Empty: the whole generation.",
    )
    normalize: list[Literal["case", "whitespace", "punctuation", "numbers"]] = Field(
        default_factory=lambda: list(NORMALIZERS),
        description="Normalisation of the answer and of the gold answers before they are compared.",
    )


def compiled(pattern: str):
    """The RE2 regex of `pattern`, or ValueError naming what RE2 refused (one line)."""
    return _compile(pattern)


@lru_cache(maxsize=256)
def _compile(pattern: str):
    if len(pattern) > REGEX_MAX_CHARS:
        raise ValueError(f"longer than {REGEX_MAX_CHARS} characters")
    options = re2.Options()
    options.max_mem = RE2_MAX_MEM
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as err:
        said = err.args[0] if err.args else err
        reason = " ".join((said.decode(errors="replace") if isinstance(said, bytes) else str(said)).split())[:160]
        raise ValueError(f"RE2 cannot compile {pattern[:60]!r} ({reason}; RE2 has no look-around or "
                         "backreferences)") from None  # fmt: skip


# -- filters ------------------------------------------------------------------------------


def _regex(f: RegexFilter, text: str) -> str | None:
    rx = compiled(f.regex)
    group = f.group if f.group is not None else min(1, rx.groups)
    if f.occurrence == "first":
        match = rx.search(text)
    else:
        match = None
        for match in rx.finditer(text):  # noqa: B007  # the last one
            pass
    return None if match is None else match.group(group)


def _numbers(text: str) -> list[str]:
    return _NUMBER.findall(text)


def _first_line(text: str) -> str | None:
    return next((line for line in text.splitlines() if line.strip()), None)


def letters(choices: Sequence[str] | None) -> str:
    """The letters of a prompt's choices: A, B, ... one per choice (all 26 where it has none)."""
    return string.ascii_uppercase[: len(choices)] if choices else string.ascii_uppercase


def _choice_letter(text: str, choices: Sequence[str] | None) -> str | None:
    valid = letters(choices)
    for m in _LETTER.finditer(text):
        if m.group(1) in valid:
            return m.group(1)
    if choices:  # no letter: the one choice whose text the generation contains
        said = _squash(text)
        hits = [i for i, c in enumerate(choices) if _squash(c) and _squash(c) in said]
        if len(hits) == 1:
            return valid[hits[0]]
    return None


def _squash(text: str) -> str:
    return " ".join(text.casefold().split())


def apply(filters: Sequence[Any], text: str, choices: Sequence[str] | None = None) -> str | None:
    """The answer the pipeline reads from `text` (before normalisation), or None: nothing found."""
    out: str | None = text
    for f in filters:
        if out is None:
            return None
        if isinstance(f, RegexFilter):
            out = _regex(f, out)
        elif f == "first_line":
            out = _first_line(out)
        elif f == "choice_letter":
            out = _choice_letter(out, choices)
        else:
            found = _numbers(out)
            out = (found[-1] if f == "last_number" else found[0]) if found else None
    return out if out is None or out.strip() else None


# -- normalisation ------------------------------------------------------------------------


def canonical_number(text: str) -> str | None:
    """`1,000` -> `1000`, `+3.0` -> `3`, `3.50` -> `3.5`, `.5` -> `0.5`, `$12` -> `12`, `1e16` ->
    `10000000000000000`; None if not one number."""
    s = text.strip().rstrip(".")
    if not _WHOLE_NUMBER.fullmatch(s):
        return None
    try:
        d = Decimal(s.lstrip("$").replace(",", ""))
    except InvalidOperation:
        return None
    out = format(d.normalize(), "f")
    return "0" if out in ("-0", "+0") else out


def normalize(text: str, how: Sequence[str] = NORMALIZERS) -> str:
    """`text` in the normal form `how` names (see the module doc)."""
    if "numbers" in how and (number := canonical_number(text)) is not None:
        return number
    if "case" in how:
        text = text.casefold()
    if "punctuation" in how:
        text = _unpunctuated(text, "numbers" in how)
    if "whitespace" in how or "punctuation" in how:
        text = " ".join(text.split())
    return text


def _unpunctuated(text: str, canonical: bool) -> str:
    """Every punctuation character a space, but a number's sign, point and thousands separators kept (`-5`,
    `1,000.5`), the number canonical as `numbers` makes it where `canonical`."""
    out, at = [], 0
    for m in _TEXT_NUMBER.finditer(text):
        out += [_spaces(text[at : m.start()]), (canonical_number(m.group()) if canonical else None) or m.group()]
        at = m.end()
    return "".join([*out, _spaces(text[at:])])


def _spaces(text: str) -> str:
    return "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)


# -- a compiled task ----------------------------------------------------------------------


class Task:
    """A `TaskSpec`, checked once: reads an answer and tells whether it is one of the gold answers."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec

    def answer(self, text: str, choices: Sequence[str] | None = None) -> str | None:
        """The normalised answer read from `text`, or None (unanswered)."""
        raw = apply(self.spec.extract, text, choices)
        if raw is None:
            return None
        out = normalize(raw, self.spec.normalize)
        return out or None

    def accepted(self, gold: Sequence[str], choices: Sequence[str] | None = None) -> frozenset[str]:
        """Every normalised form a right answer may take: each gold answer and, for multiple choice, the letter
        of a gold choice's text and the text of a gold letter's choice."""
        how = self.spec.normalize
        out = {normalize(g, how) for g in gold}
        if choices:
            valid = letters(choices)
            texts = {normalize(c, how) for c in choices}
            # `b` is B where `case` is on, unless it is a choice's text: gold `a` of choices [b, a] is not letter A
            gold_letters = {normalize(g.strip().strip("()"), how) for g in gold if normalize(g, how) not in texts}
            for i, choice in enumerate(choices):
                if normalize(choice, how) in out or normalize(valid[i], how) in gold_letters:
                    out |= {normalize(valid[i], how), normalize(choice, how)}
        return frozenset(x for x in out if x)


@lru_cache(maxsize=64)
def _task(doc: str) -> Task:
    return Task(TaskSpec.model_validate_json(doc))


def task_of(doc: dict | None) -> Task:
    """The compiled task of a sweep's `task:` section as JSON (None: the default, the whole text normalised)."""
    return _task(json.dumps(doc or {}, sort_keys=True))


def task_section(doc: Any) -> dict | None:
    """A stored spec's `task:` section, checked, as JSON (None where it has none; where this version cannot read
    it, the default: a submitted sweep's section was validated when it was submitted)."""
    if doc is None:
        return None
    try:
        return TaskSpec.model_validate(doc).model_dump(mode="json")
    except ValueError:
        return None
