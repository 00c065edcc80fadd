"""Reading a prompt set: a JSONL or CSV file, or the spec's inline list, to `PromptItem`s."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from controller.spec.models import PromptSet
from worker.core.contract import PromptItem
from worker.core.errors import UsageError


def load_prompts(prompts: PromptSet) -> list[PromptItem]:
    """The prompt set's items, in file order, with stable ids, cut to `limit`."""
    raw: list[Any]
    if prompts.inline is not None:
        raw = list(prompts.inline)
        where = "prompts.inline"
    else:
        path = Path(prompts.path)
        where = f"prompts.path ({path.name})"
        if path.suffix.lower() == ".csv":
            with path.open(newline="") as f:
                raw = list(csv.DictReader(f))
        else:
            raw = []
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if line.strip():
                    try:
                        raw.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise UsageError(f"{where}: line {n} is not valid JSON: {err.msg}") from None
    items = []
    for i, entry in enumerate(raw):
        if isinstance(entry, str):
            entry = {"prompt": entry}
        if isinstance(entry, PromptItem):
            items.append(entry)
            continue
        if not isinstance(entry, dict) or not str(entry.get("prompt") or "").strip():
            raise UsageError(f"{where}: item {i} has no `prompt`")
        extra = set(entry) - {"id", "prompt", "reference"}
        if extra:
            raise UsageError(f"{where}: item {i} has unknown field {sorted(extra)[0]!r} (valid: id, prompt, reference)")
        items.append(
            PromptItem(
                id=str(entry.get("id") or f"p{i:05d}"), prompt=entry["prompt"], reference=entry.get("reference") or None
            )
        )
    ids = [p.id for p in items]
    if len(set(ids)) != len(ids):
        raise UsageError(f"{where}: prompt ids are not unique")
    if not items:
        raise UsageError(f"{where}: the prompt set is empty")
    return items[: prompts.limit] if prompts.limit else items
