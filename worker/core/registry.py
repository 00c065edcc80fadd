"""One small generic registry for strategies and metrics (after lm-eval's registry).

Entries register by decorator with their metadata; an unknown name fails with
"did you mean …" and the list of valid names.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from worker.core.errors import UsageError, short

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> entry mapping for one kind of plugin (e.g. "strategy", "metric")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self.aliases: dict[str, str] = {}  # another name a user may know an entry by -> its registered name

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def decorator(self, name: str, make: Callable[[Callable], T]) -> Callable[[Callable], Callable]:
        """Register `make(fn)` under `name` and return `fn` unchanged."""

        def wrap(fn: Callable) -> Callable:
            self.register(name, make(fn))
            return fn

        return wrap

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UsageError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        alias = self.aliases.get(name.lower().replace("-", "_")) if isinstance(name, str) else None
        close = [alias] if alias else difflib.get_close_matches(name, self._entries, n=1) if len(name) <= 100 else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {short(name)}{hint} (valid: {', '.join(self.valid_names())})"

    def valid_names(self) -> list[str]:
        """The names an unknown name's message lists."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._entries.items())

    def names(self) -> list[str]:
        return sorted(self._entries)
