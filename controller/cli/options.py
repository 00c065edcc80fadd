"""Options shared by the `decodebench` commands, built from `worker.core.settings`."""

from __future__ import annotations

import click

from worker.core import settings


def _tenant(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return settings.tenant(value)  # UsageError (one line, exit 2) for an unsafe name


tenant = settings.option("tenant", callback=_tenant)
store = settings.option("store")
redis_url = settings.option("redis_url")
priority = click.option(
    "--priority",
    type=click.Choice(["high", "normal", "low"]),
    default="normal",
    show_default=True,
    help="Queue priority: workers take high before normal before low.",
)
api = settings.option(
    "api_url", "--api", "api", help="Submission server URL (DECODEBENCH_API_URL); the tenant comes from your token."
)


def store_flag(url: str) -> str:
    """` --store URL` for a command to print as the next step, or nothing for the default store."""
    import shlex

    from worker.core.safetext import terminal

    same = url in (None, "") or url == settings.get("store")  # what the next command finds by itself
    return "" if same else f" --store {terminal(shlex.quote(str(url)))}"


def location(store, key: str) -> str:
    """Where a stored object is, for people: a local path (relative when under the working
    directory) for a file store, else the store's URL; escape sequences made visible."""
    import os

    from worker.core.safetext import terminal

    where = f"{store.url}/{key}"
    if where.startswith("file://"):
        where = where[len("file://") :]
        relative = os.path.relpath(where)
        where = where if relative.startswith("..") else relative
    return terminal(where)
