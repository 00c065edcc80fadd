"""Settings: flags first, then DECODEBENCH_* environment variables, then defaults."""

from __future__ import annotations

import os

DEFAULTS = {
    "store": "./runs",
    "tenant": "default",
    "redis_url": "redis://127.0.0.1:6379/0",
    "log_format": "console",
}


def setting(name: str, flag: str | None = None) -> str:
    """`flag` if given, else DECODEBENCH_<NAME>, else the default."""
    if flag:
        return flag
    return os.environ.get(f"DECODEBENCH_{name.upper()}") or DEFAULTS[name]
