"""The `decodebench` command line (click). User errors print one line and exit non-zero.

Each command module imports only click and the settings at import time, so that
`decodebench --help` loads neither pandas nor torch; the work happens in
`controller.sweep`, `controller.launch`, `controller.report` and `controller.ops`.
"""

from __future__ import annotations

import errno
import traceback

import click

from worker.core import settings
from worker.core.errors import DecodebenchError, quote
from worker.core.safetext import terminal
from worker.core.usage import OneLineUsage, one_line


class Group(OneLineUsage, click.Group):
    """Turns a DecodebenchError into one line on stderr and its exit code (2 for bad input),
    and so click's own usage errors (an unknown command or option, a missing argument, a bad
    value): `error: ...`, exit 2. `--help` is click's.

    With `--debug` (DECODEBENCH_DEBUG=1) the traceback comes first, for maintainers. Any
    other exception is a bug and keeps its traceback.
    """

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as err:  # raised while parsing the command's arguments
            one_line(err)
        except DecodebenchError as err:
            if ctx.params.get("debug"):
                click.echo(traceback.format_exc(), err=True, nl=False)
            click.echo(f"error: {terminal(err)}", err=True)  # names in it are user input
            ctx.exit(err.exit_code)
        except OSError as err:  # a path given on the command line (--out) that no file system takes
            if err.errno not in (errno.ENAMETOOLONG, errno.ELOOP):
                raise
            if ctx.params.get("debug"):
                click.echo(traceback.format_exc(), err=True, nl=False)
            click.echo(f"error: {quote(str(err.filename or ''), 80)}: {err.strerror}", err=True)
            ctx.exit(2)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@settings.option("log_format", type=click.Choice(["console", "json"]))
@settings.option("log_level")
@settings.option("debug", is_flag=True)
@click.version_option(package_name="decodebench")
def main(log_format: str, log_level: str, debug: bool) -> None:
    """Compare text-generation decoding strategies across language models."""
    from worker.core.logs import configure

    configure(log_format, log_level)


from controller.cli import distributed, local, ops, rate, report, serve, tenants  # noqa: E402  (the commands)

for _module in (local, distributed, report, rate, ops, tenants, serve):
    for _command in _module.COMMANDS:
        main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
