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
