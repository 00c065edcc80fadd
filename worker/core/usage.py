"""click's own usage errors in one line, for both command lines (`decodebench`, `decodebench-worker`).

click answers an unknown option, a missing argument or a bad value with a usage block of
several lines; decodebench answers every input problem with one line on stderr,
`error: ...`, and exit code 2. `--help` (and a group called with no arguments, which
shows its help) is left as click prints it.
"""

from __future__ import annotations

from typing import NoReturn

import click
from click.exceptions import NoArgsIsHelpError


def one_line(err: click.UsageError) -> NoReturn:
    """Print a click usage error as one line on stderr and exit 2."""
    if isinstance(err, NoArgsIsHelpError):  # the help text itself, not an error
        raise err
    message = " ".join(err.format_message().split())
    hint = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
    click.echo(f"error: {message}{hint}", err=True)
    raise click.exceptions.Exit(2)


class OneLineUsage:
    """Mixin for a click Command or Group: usage errors while parsing its own arguments are one line."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as err:
            one_line(err)


class Command(OneLineUsage, click.Command):
    """A click Command whose usage errors are one line (exit 2)."""
