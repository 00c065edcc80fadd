"""A spec's validation error in the user's words: the key they meant, the form a value takes.

pydantic says "Extra inputs are not permitted", "Input should be a valid dictionary or instance of
ModelSpec" and, for a field that takes an integer or 'auto', two errors, one per member of the union.
`explain(error, errors)` turns the first error into what to write instead: `unknown key; did you
mean 'generation'?`, `a model is a mapping: write '- path: gpt2'`, `must be an integer or 'auto'`.
A rule over a whole model raises `at(loc, message)`, which names the field it is about."""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticCustomError

# A union member's tag in an error's location (pydantic puts it after the field's name).
_MEMBER = re.compile(r"^(int|float|str|bool|none|literal\[.*\]|list\[.*\]|dict\[.*\]|constrained-\w+|[A-Z]\w*)$")
# Keys of other tools (transformers, vLLM, OpenAI) and the place they have here.
ALIASES = {
    "max_tokens": "generation.max_new_tokens",
    "max_length": "generation.max_new_tokens",
    "max_new_tokens": "generation.max_new_tokens",
    "seed": "generation.seeds",
    "seeds": "generation.seeds",
    "batch_size": "generation.batch_size",
    "temperature": "params.temperature of a strategy",
    "top_p": "a strategy: {name: top_p, params: {p: ...}}",
    "top_k": "a strategy: {name: top_k, params: {k: ...}}",
    "model": "models (a list)",
    "strategy": "strategies (a list)",
    "prompt": "prompts",
}
_KINDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "none": "null"}


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through Optional, list, dict, unions, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models(arg)
    return out


def _fields_at(root: type[BaseModel], loc: tuple[Any, ...]) -> set[str]:
    """The field names valid at `loc` (list indices skipped) below `root`."""
    here = [root]
    for part in loc:
        if isinstance(part, int) or (isinstance(part, str) and _MEMBER.fullmatch(part)):
            continue
        here = [m for model in here if part in model.model_fields for m in _models(model.model_fields[part].annotation)]
    return {name for model in here for name in model.model_fields}


def _all_fields(root: type[BaseModel], prefix: str = "", seen: set | None = None) -> dict[str, str]:
    """Every field's dotted path below `root`, by its own name (the first path of a name wins)."""
    seen = seen if seen is not None else set()
    out: dict[str, str] = {}
    if root in seen:
        return out
    seen.add(root)
    for name, info in root.model_fields.items():
        out.setdefault(name, prefix + name)
        for model in _models(info.annotation):
            for k, v in _all_fields(model, f"{prefix}{name}.", seen).items():
                out.setdefault(k, v)
    return out


def unknown_key(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """`unknown key; did you mean 'generation'?` (a near name here), or the key's place elsewhere."""
    key = loc[-1]
    if not isinstance(key, str):
        return "unknown key"
    here = _fields_at(root, loc[:-1])
    close = difflib.get_close_matches(key, sorted(here), n=1, cutoff=0.7)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    elsewhere = _all_fields(root)
    near = difflib.get_close_matches(key, elsewhere, n=1, cutoff=0.8)
    place = ALIASES.get(key) or (elsewhere[near[0]] if near else None)
    if place and place.split(".")[-1] not in here:
        return f"unknown key here; did you mean {place}?"
    valid = ", ".join(sorted(here)) if here else ""
    return "unknown key" + (f"; valid here: {valid}" if valid else "")


def _member(tag: str) -> str:
    if tag.startswith("literal["):
        return tag[len("literal[") : -1].replace(",", " or")
    if tag.startswith("list["):
        return "a list"
    if tag.startswith("dict[") or tag[:1].isupper():
        return "a mapping"
    return _KINDS.get(tag.removeprefix("constrained-"), tag)


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _got(value: Any) -> str:
    return f"got '{_clip(value, 40)}'" if isinstance(value, str) else f"got {type(value).__name__}"


def explain(first: dict[str, Any], errors: list[dict[str, Any]], root: type[BaseModel]) -> str | None:
    """The user's words for pydantic's first error, or None to keep pydantic's own."""
    loc = tuple(first["loc"])
    if first["type"] == "extra_forbidden":
        return unknown_key(root, loc)
    if first["type"] == "model_type":
        value = first.get("input")
        if loc[:1] == ("models",) and isinstance(value, str):
            return f"a model is a mapping: write `- path: {_clip(value)}`"
        if loc[:1] == ("strategies",) and isinstance(value, str):
            return f"a strategy is a mapping: write `- name: {_clip(value)}`"
        return f"expected a mapping (key: value lines), {_got(value)}"
    if loc and isinstance(loc[-1], str) and _MEMBER.fullmatch(loc[-1]):  # one error per member of a union
        base = loc[:-1]
        tags = [str(e["loc"][-1]) for e in errors if tuple(e["loc"][:-1]) == base and e["loc"][-1] != loc[-1]]
        kinds = list(dict.fromkeys(_member(t) for t in [loc[-1], *tags]))
        return f"must be {' or '.join(kinds)}, {_got(first.get('input'))}"
    if first["type"] == "int_type":  # a strict integer field: true, 12.0 and "12" are not integers
        return f"must be an integer, {_got(first.get('input'))}"
    return None


def at(loc: tuple[Any, ...], message: str) -> PydanticCustomError:
    """A rule's error placed at `loc` below the field or model that raises it, so that the message names the line
    of what it is about (a `metrics` entry, not the spec's first line; controller.sweep.load)."""
    return PydanticCustomError("at", "{message}", {"message": message, "loc": loc})


def member_free(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The location without a union member's tag at its end (`generation.batch_size`, not `.int`)."""
    return loc[:-1] if loc and isinstance(loc[-1], str) and _MEMBER.fullmatch(loc[-1]) else loc


def plural(n: int, word: str, words: str | None = None) -> str:
    """`word` or its plural for `n` (`1 job`, `2 jobs`, `0 jobs`); `words` where it is not `word` + s."""
    return word if n == 1 else (words or word + "s")


def repeated(values: list[Any]) -> int | None:
    """The index of the first value that came before, or None where all differ (linear: a CSV header of 10^5
    columns is one pass)."""
    seen = set()
    for i, value in enumerate(values):
        if value in seen:
            return i
        seen.add(value)
    return None
