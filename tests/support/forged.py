"""What a forged job hash names as its callbacks: a module-level function that, if a worker ever
imported and called it, would leave a marker file (FORGED_MARKER). tests/hostile/test_worker_obeys.py
checks that no worker does: the module is never even imported."""

from __future__ import annotations

import os


def mark(*args, **kwargs) -> None:
    with open(os.environ["FORGED_MARKER"], "a") as f:
        f.write("called\n")
