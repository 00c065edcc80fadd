"""Settings: flags first, then DECODEBENCH_* environment variables, then defaults."""

from __future__ import annotations

import os

from worker.keys import DEFAULT_REDIS_URL
from worker.store import DEFAULT_STORE, Store, open_store

DEFAULTS = {
    "store": DEFAULT_STORE,
    "tenant": "default",
    "redis_url": DEFAULT_REDIS_URL,
    "log_format": "console",
}


def setting(name: str, flag: str | None = None) -> str:
    """`flag` if given, else DECODEBENCH_<NAME>, else the default."""
    if flag:
        return flag
    return os.environ.get(f"DECODEBENCH_{name.upper()}") or DEFAULTS[name]


def configured_store(flag: str | None = None) -> Store:
    """The store from `--store`/`--out`, else DECODEBENCH_STORE, else ./runs."""
    return open_store(setting("store", flag))
