"""The prompt set: the spec's `prompts` section (`PromptSet`), and reading it, a JSONL or CSV file or
the spec's inline list, to `PromptItem`s. An inline entry is checked as a file's line is, when the spec is.

Files are streamed: read in chunks, decoded incrementally (UTF-8, UTF-8 with a BOM, or
UTF-16 with a BOM, as spreadsheets export), split on "\\n" only (a JSON string may hold
U+2028 or U+0085), within DECODEBENCH_PROMPT_FILE_MAX_MB and
DECODEBENCH_PROMPT_LINE_MAX_CHARS. Every failure is one UsageError line naming the file
and the line (JSONL), row (CSV) or item (inline), or the byte offset of an undecodable byte.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import json
import math
import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from controller.sweep import yamlsafe
from controller.sweep.wording import at, repeated
from worker.core import settings
from worker.core.chat import NO_USER_TURN
from worker.core.chatformat import CHAT_ROLES
from worker.core.contract import PromptItem, Strict
from worker.core.errors import UsageError, short, shown

CHUNK = 1 << 16
_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_ENCODINGS = "prompt files must be UTF-8, UTF-8 with a BOM or UTF-16 with a BOM"
FIELDS = ("id", "prompt", "reference", "messages", "system", "answer", "choices")
MAX_CHOICES = 26  # lettered A to Z
MAX_EXPONENT = 1000  # an `answer` or a choice is written out in full: 1e1000 (1,001 digits) at most


def sniff_encoding(head: bytes) -> tuple[str, int]:
    """(encoding, BOM length) of a text file from its first bytes: a UTF-8 or UTF-16 BOM, else UTF-8.
    Prompt files and returned rating sheets accept the same encodings."""
    return next(((enc, len(bom)) for bom, enc in _BOMS if head.startswith(bom)), ("utf-8", 0))


def _open(path: Path, name: str):
    try:
        f = path.open("rb")
        size = os.fstat(f.fileno()).st_size
    except OSError as err:
        raise UsageError(f"{name}: cannot read the prompt file ({err.strerror or err})") from None
    limit_mb = settings.get("prompt_file_max_mb")
    if size > limit_mb * 2**20:
        f.close()
        raise UsageError(
            f"{name}: the prompt file is {size:,} bytes, over the limit of {limit_mb} MiB "
            f"(DECODEBENCH_PROMPT_FILE_MAX_MB)"
        )
    return f


def _too_long(name: str, n: int, max_chars: int) -> str:
    return f"{name}:{n}: a line longer than {max_chars:,} characters (DECODEBENCH_PROMPT_LINE_MAX_CHARS)"


def text_lines(path: Path, name: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file, decoded as its BOM says, split on "\\n" only."""
    max_chars = settings.get("prompt_line_max_chars")
    with _open(path, name) as f:
        head = f.read(3)
        encoding, offset = sniff_encoding(head)
        f.seek(offset)
        decoder = codecs.getincrementaldecoder(encoding)("strict")
        pending, n = "", 0
        while True:
            chunk = f.read(CHUNK)
            buffered = len(decoder.getstate()[0])
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                at = offset - buffered + err.start
                raise UsageError(f"{name}: not {encoding.upper()[:6]} text at byte {at}; {_ENCODINGS}") from None
            nul = chunk.find(b"\0") if encoding == "utf-8" else -1
            if nul >= 0:  # UTF-16 without a BOM, or a binary file
                raise UsageError(f"{name}: a NUL byte at byte {offset + nul}; {_ENCODINGS}")
            offset += len(chunk)
            *lines, pending = (pending + text).split("\n")
            for line in lines:
                n += 1
                if len(line) > max_chars:
                    raise UsageError(_too_long(name, n, max_chars))
                yield n, line.removesuffix("\r")
            if len(pending) > max_chars:
                raise UsageError(_too_long(name, n + 1, max_chars))
            if not chunk:
                break
        if pending:
            yield n + 1, pending.removesuffix("\r")


def _jsonl(path: Path, name: str) -> Iterator[tuple[str, Any]]:
    for n, line in text_lines(path, name):
        if not line.strip():
            continue
        try:
            yield f"{name}:{n}", json.loads(line, object_pairs_hook=yamlsafe.unique_keys)
        except yamlsafe.DuplicateKey as err:
            raise UsageError(f"{name}:{n}: {err}") from None
        except RecursionError:  # the json scanner recurses once per level of nesting
            raise UsageError(f"{name}:{n}: the JSON is nested too deeply") from None
        except ValueError as err:  # JSONDecodeError, or an integer of more than 4300 digits
            msg = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
            raise UsageError(f"{name}:{n}: not valid JSON: {shown(msg, 120)}") from None


def _csv(path: Path, name: str) -> Iterator[tuple[str, Any]]:
    max_chars = settings.get("prompt_line_max_chars")
    ended = False

    def lines() -> Iterator[str]:
        nonlocal ended
        for _, line in text_lines(path, name):
            yield line + "\n"
        ended = True

    reader = csv.reader(lines())
    old_limit = csv.field_size_limit(max_chars)
    try:
        header: list[str] | None = None
        row = 0
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                if "field larger than field limit" in str(err):
                    err = f"a field longer than {max_chars:,} characters (DECODEBENCH_PROMPT_LINE_MAX_CHARS)"
                raise UsageError(f"{name}:{reader.line_num}: row {row + 1}: {err}") from None
            if ended and fields:  # every line ends in "\n": only a quoted field left open reads to the end
                opened = reader.line_num - fields[-1].count("\n") + 1
                raise UsageError(
                    f"{name}:{opened}: a quoted field opened on this line is never closed (a missing '\"')"
                )
            if not fields:
                continue
            if header is None:
                header = fields
                if (i := repeated(header)) is not None:
                    raise UsageError(
                        f"{name}:{reader.line_num}: the header names the column {short(header[i], 40)} twice"
                    )
                continue
            row += 1
            where = f"{name}:{reader.line_num}: row {row}"
            if len(fields) > len(header):
                raise UsageError(f"{where}: {len(fields)} fields, but the header names {len(header)}")
            yield where, {k: (v if v != "" else None) for k, v in zip(header, fields)}
    finally:
        csv.field_size_limit(old_limit)


def _messages(where: str, messages: Any, system: Any, prompt: Any) -> list[dict[str, str]] | None:
    """The item's conversation, checked: its `messages`, or a `system` column with the prompt as the user's
    turn; None for a plain prompt."""
    if system is not None and not isinstance(system, str):
        raise UsageError(f"{where}: `system` must be a string, got {type(system).__name__}")
    if messages is None:
        if system is None:
            return None
        if not isinstance(prompt, str):
            raise UsageError(f"{where}: a `system` prompt needs a `prompt` (the user's turn)")
        return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    if system is not None:
        raise UsageError(f"{where}: give `system` or `messages`, not both (put the system turn in `messages`)")
    if not isinstance(messages, list):
        raise UsageError(f"{where}: `messages` must be a list of {{role, content}}, got {type(messages).__name__}")
    if not messages:
        raise UsageError(f"{where}: `messages` is an empty conversation")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise UsageError(f"{where}: messages[{k}] must be an object with exactly `role` and `content`")
        if m["role"] not in CHAT_ROLES:
            raise UsageError(
                f"{where}: messages[{k}]: unknown role {short(str(m['role']), 40)} (valid: {', '.join(CHAT_ROLES)})"
            )
        if not isinstance(m["content"], str):
            raise UsageError(f"{where}: messages[{k}].content must be a string, got {type(m['content']).__name__}")
    if not any(m["role"] == "user" for m in messages):  # with a `prompt` too: the model would never see it
        raise UsageError(f"{where}: {NO_USER_TURN}")
    return messages


def prompt_item(where: str, i: int, entry: Any) -> PromptItem:
    """Item `i` of a prompt set (a file's line or row, or an inline entry), checked: a UsageError naming `where`;
    without an `id`, its id is `p` and `i` in five digits."""
    if isinstance(entry, PromptItem):
        entry = entry.model_dump()
    if isinstance(entry, str):
        entry = {"prompt": entry}
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: an item must be an object with `prompt` or a string, got {type(entry).__name__}")
    extra = sorted((str(k) for k in set(entry) - set(FIELDS)), key=str)
    if extra:
        raise UsageError(f"{where}: unknown field {short(extra[0], 40)} (valid: {', '.join(FIELDS)})")
    prompt, ref, pid = entry.get("prompt"), entry.get("reference"), entry.get("id")
    if prompt is not None and not isinstance(prompt, str):
        raise UsageError(f"{where}: `prompt` must be a string, got {type(prompt).__name__}")
    messages = _messages(where, entry.get("messages"), entry.get("system"), prompt)
    if prompt is None and messages is not None:
        prompt = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if not prompt or not prompt.strip():
        raise UsageError(f"{where}: item {i} has no `prompt`")
    if ref is not None and not isinstance(ref, str):
        raise UsageError(f"{where}: `reference` must be a string or null, got {type(ref).__name__}")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, (str, int))):
        raise UsageError(f"{where}: `id` must be a string or an integer, got {type(pid).__name__}")
    for field, text in (("id", pid), ("prompt", prompt), ("reference", ref)):
        _check_unicode(where, field, text)
    for k, m in enumerate(messages or []):
        _check_unicode(where, f"messages[{k}].content", m["content"])
    answer, choices = _answer(where, entry.get("answer")), _choices(where, entry.get("choices"))
    for field, texts in (("answer", answer), ("choices", choices)):
        for text in texts or []:
            _check_unicode(where, field, text)
    pid = str(pid) if pid not in (None, "") else f"p{i:05d}"
    return PromptItem(id=pid, prompt=prompt, reference=ref or None, messages=messages, answer=answer, choices=choices)


def _check_unicode(where: str, field: str, text: Any) -> None:
    """A text that is not valid Unicode (a lone surrogate, as JSON's "\\ud800" writes one) is refused here,
    naming where, not met later by a tokenizer or an encoder."""
    if isinstance(text, str) and (why := yamlsafe.unicode_fault(text)):
        raise UsageError(f"{where}: `{field}` is not valid Unicode: {why}")


def _scalar(value: Any) -> str | None:
    """A gold answer or a choice as text: a string, or a number as Python writes it, in positional notation (42,
    4.5; 1e16 and 1e-05, which the answer filters do not read as numbers, as 10000000000000000 and 0.00001: the
    only texts that changed, so every other prompt set keeps its sweep id); None otherwise."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    text = str(value)  # an integer, 4.5, or YAML's .inf and .nan
    if isinstance(value, float) and math.isfinite(value) and "e" in text:
        exact = Decimal(repr(value))
        return format(exact, "f") if abs(exact.adjusted()) <= MAX_EXPONENT else None
    return text


def _answer(where: str, value: Any) -> list[str] | None:
    """`answer`: a string or number, or a non-empty list of them (the accepted answers)."""
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    out = [_scalar(v) for v in values]
    if not out or any(v is None or not v.strip() for v in out):
        raise UsageError(f"{where}: `answer` must be a non-empty string or number, or a non-empty list of them")
    return out


def _choices(where: str, value: Any) -> list[str] | None:
    """`choices`: a list of 2 to 26 strings (in a CSV cell, that list as JSON)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    out = [_scalar(v) for v in value] if isinstance(value, list) else None
    if out is None or not 2 <= len(out) <= MAX_CHOICES or any(v is None or not v.strip() for v in out):
        raise UsageError(f"{where}: `choices` must be a list of 2 to {MAX_CHOICES} non-empty strings")
    return out


def inline_where(i: int) -> str:
    """How an error names the spec's inline prompt `i`."""
    return f"prompts.inline[{i}]"


# An inline prompt: a string, or an object of a prompt file's fields (made a PromptItem by PromptSet's validator).
InlinePrompt = Annotated[
    str | PromptItem,
    WithJsonSchema(
        {"anyOf": [{"type": "string"}, {"type": "object", "properties": {f: {} for f in FIELDS}, "required": []}]}
    ),
]


class PromptSet(Strict):
    """Where the prompts come from: a JSONL/CSV file or an inline list."""

    path: str | None = Field(
        default=None,
        description="JSONL or CSV file (relative to the spec file) with fields `prompt`, "
        "optional `reference` and `id`; for chat models `messages` ([{role, content}]) or a `system` column.",
    )
    inline: list[InlinePrompt] | None = Field(
        default=None,
        description="Prompts written in the spec: strings, or objects with the fields of a JSONL file's line "
        "(`prompt`, `id`, `reference`, `messages`, `system`, `answer`, `choices`), checked the same way.",
    )
    limit: int | None = Field(default=None, strict=True, ge=1, description="Use only the first N prompts.")
    shard_size: int = Field(
        default=32,
        strict=True,
        ge=1,
        description="Prompts per job: a cell's prompts are split into shards of this size.",
    )

    @field_validator("inline", mode="before")
    @classmethod
    def _inline_items(cls, v: Any) -> Any:
        """Each entry checked as a file's line is, an object made its PromptItem: an error names the entry's line in
        the spec."""
        if not isinstance(v, list):
            return v
        out = []
        for i, entry in enumerate(v):
            try:
                item = prompt_item(inline_where(i), i, entry)
            except UsageError as err:
                raise at((i,), str(err).removeprefix(f"{inline_where(i)}: ")) from None
            out.append(entry if isinstance(entry, str) else item)
        return out

    @model_validator(mode="after")
    def _one_source(self) -> PromptSet:
        if (self.path is None) == (self.inline is None):
            raise ValueError("give exactly one of `path` or `inline`")
        return self


def load_prompts(prompts: PromptSet) -> list[PromptItem]:
    """The prompt set's items, in file order, with stable ids, cut to `limit`."""
    if prompts.inline is not None:
        source = "prompts.inline"
        entries: Iterator[tuple[str, Any]] = ((inline_where(i), e) for i, e in enumerate(prompts.inline))
    else:
        path = Path(prompts.path)
        source = shown(str(path))
        entries = _csv(path, source) if path.suffix.lower() == ".csv" else _jsonl(path, source)
    items: list[PromptItem] = []
    seen: set[str] = set()
    with contextlib.closing(entries):
        for i, (where, entry) in enumerate(entries):
            item = prompt_item(where, i, entry)
            if item.id in seen:
                raise UsageError(f"{where}: prompt id {short(item.id)} is used twice; prompt ids must be unique")
            seen.add(item.id)
            items.append(item)
    if not items:
        raise UsageError(f"{source}: the prompt set is empty")
    return items[: prompts.limit] if prompts.limit else items
