"""`decodebench tenants check|acl TENANTS.yaml`: validate a tenants file, print its Redis ACL file."""

from __future__ import annotations

import click


@click.group()
def tenants() -> None:
    """Tenants of a shared deployment (docs/tenants.md)."""


@tenants.command()
@click.argument("path", metavar="TENANTS.yaml")
def check(path: str) -> None:
    """Validate a tenants file (one line naming the field, exit 2, if it is wrong)."""
    from worker.core.tenants import load_tenants

    spec = load_tenants(path)
    for t in spec.tenants:
        quota = t.max_running if t.max_running is not None else "no limit"
        click.echo(f"{t.name}: weight {t.weight:g}, max_running {quota}, models {t.models or 'any'}")


@tenants.command()
@click.argument("path", metavar="TENANTS.yaml")
def acl(path: str) -> None:
    """Print the Redis ACL file: passwords hashed from the environment variables the file names."""
    from controller.ops.acl import render_acl
    from worker.core.tenants import load_tenants

    click.echo(render_acl(load_tenants(path)), nl=False)


COMMANDS = [tenants]
