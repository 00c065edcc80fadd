"""Where else a sweep is: the local stores beside the one asked (`./runs` and the stores directly under
it, as `runs/demo`), named in the "no sweep" error so that a command run without `--store` says which
`--store` finds the sweep. File stores only, and only on that error path."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from worker.core import paths, settings


def _candidates() -> list[Path]:
    root = Path(settings.DEFAULT_STORE)
    if not root.is_dir():
        return []
    return [root, *sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))]


def stores_with(tenant: str, sweep: str, asked: Path | None) -> list[str]:
    """The local stores other than `asked` holding a sweep that `sweep` names (its id or a prefix), as a
    user types them (relative to the working directory where under it)."""
    found = []
    for store in _candidates():
        if asked is not None and store.resolve() == asked:
            continue
        sweeps = store / paths.sweeps_prefix(tenant)
        try:
            names = [p.name for p in sweeps.iterdir() if p.name.startswith(sweep)] if sweeps.is_dir() else []
        except OSError:
            continue
        if any((store / paths.spec_key(tenant, name)).is_file() for name in names):
            relative = os.path.relpath(store)
            found.append(str(store.resolve()) if relative.startswith("..") else relative)
    return found


def elsewhere(tenant: str, sweep: str, asked: Path | None) -> str:
    """`; it is in runs/demo: add --store runs/demo`, or nothing."""
    found = stores_with(tenant, sweep, asked)
    if not found:
        return ""
    where = " and ".join(found[:3])
    return f"; it is in {where}: add --store {shlex.quote(found[0])}"
