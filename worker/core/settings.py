"""Every `DECODEBENCH_*` setting resolved in one place, from the one table (`worker.core.settingtable`).

A setting's value comes from the command-line flag if one is given, else from its
environment variable, else from its default. Both console scripts build their options
from the table (`option(...)`), so the help text, the variable name, the default and the values
it takes are written once; library code reads a setting with `get(...)`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from worker.core.errors import UsageError
from worker.core.settingtable import DEFAULT_STORE, DEFAULT_TENANT, SETTINGS

__all__ = ["DEFAULT_STORE", "DEFAULT_TENANT", "SETTINGS", "check_tenant", "get", "option", "parse_device", "tenant"]

_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def check_tenant(tenant: str) -> str:
    """Tenants name a store prefix and a queue: keep them to safe characters (ValueError if not)."""
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):  # fullmatch: `$` would pass "team-a\n"
        raise ValueError(f"tenant {tenant!r} must be 1-63 letters, digits, '.', '_' or '-'")
    return tenant


def parse_device(name: str) -> str:
    """Normalise `cuda` to `cuda:0`; reject anything but cpu and cuda:N (UsageError)."""
    if not _DEVICE.fullmatch(name or ""):
        raise UsageError(f"--device {name!r}: use cpu or cuda:N")
    return "cuda:0" if name == "cuda" else name


def get(name: str, flag: Any = None) -> Any:
    """`flag` if given, else DECODEBENCH_<NAME> parsed, else the default.

    A malformed environment value, or one out of the setting's range or choices, is a UsageError naming the
    variable.
    """
    setting = SETTINGS[name]
    if flag is not None and flag != "":
        return flag
    raw = os.environ.get(setting.envvar)
    if raw is None or raw == "":
        return setting.default
    try:
        value = setting.parse(raw)
    except ValueError:
        raise UsageError(f"{setting.envvar}={raw!r}: not a valid value ({setting.help})") from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # a count, size or time: none is negative
        low = setting.low if setting.low is not None else 0
        if not math.isfinite(value) or value < low:
            raise UsageError(f"{setting.envvar}={raw!r}: must be {low} or more ({setting.help})")
    if setting.choices and value.lower() not in setting.choices:
        raise UsageError(f"{setting.envvar}={raw!r}: must be one of {', '.join(setting.choices)}")
    return value.lower() if setting.choices else value


def tenant(flag: str | None = None) -> str:
    """The tenant from `--tenant` / DECODEBENCH_TENANT / default, checked (UsageError if unsafe)."""
    value = flag if flag is not None else get("tenant")
    try:
        return check_tenant(value)
    except ValueError as err:
        raise UsageError(str(err)) from None


def finite_float(low: float) -> Any:
    """A float option's type: at least `low`, and finite (click's FloatRange lets NaN through every bound); for
    every float flag, of the table or not."""
    import click

    return _finite(click, low)


def _finite(click: Any, low: float) -> Any:

    class Finite(click.FloatRange):
        def convert(self, value, param, ctx):
            out = super().convert(value, param, ctx)
            if not math.isfinite(out):
                self.fail(f"{value!r} is not a finite number.", param, ctx)
            return out

    return Finite(min=low)


def option(name: str, *decls: str, **kwargs: Any):
    """A click option for setting `name`: help, environment variable and default from the table.

    click applies the precedence flag > DECODEBENCH_<NAME> > default, refuses a value out of the setting's
    range or choices (naming the flag and the variable), and shows the variable and the default in `--help`
    (`show_envvar`), so none of them is written twice.
    """
    import click

    setting = SETTINGS[name]
    decls = decls or (f"--{name.replace('_', '-')}",)
    low = setting.low if setting.low is not None else 0  # as `get`: no count, size or time is negative
    types = {float: _finite(click, low), int: click.IntRange(min=low)}
    choice = click.Choice(setting.choices, case_sensitive=False) if setting.choices else None
    kwargs.setdefault("type", choice or types.get(setting.parse))
    kwargs.setdefault("help", setting.help)
    default = kwargs.pop("default", setting.default)
    if isinstance(default, list):
        default = ",".join(map(str, default))
    if kwargs.get("multiple") and default is not None:
        default = (default,)
    if all(d.startswith("-") for d in decls):
        decls = (*decls, name)
    return click.option(
        *decls, default=default, envvar=setting.envvar, show_envvar=True, show_default=default is not None, **kwargs
    )
