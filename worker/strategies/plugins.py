"""Strategy plugins: strategies that installed packages register through the entry-point group
`decodebench.strategies` (docs/sweeps.md, "Write your own strategy"). Light: never imports torch.

An entry point's name is its strategy's name and its object a `Strategy`, e.g. in the plugin's
pyproject.toml: `[project.entry-points."decodebench.strategies"] mirostat = "decodebench_mirostat:STRATEGY"`.
`load_plugins()` runs once, when `worker.strategies` is imported, after the built-ins: each plugin
is checked as the built-ins are declared (its parameters and their defaults, its kind, its step, its
name) and registered. One that fails to import, or fails a check, is not registered: it becomes one
line in `PROBLEMS` (and in `BROKEN_PLUGINS`, under its name) naming the entry point and the reason,
which `decodebench strategies` and `validate` print; nothing else is affected.

Only installed packages are plugins: a sweep names a strategy by its registered name, never a module
or an import path, so a worker runs only the code installed in its image.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from worker.core.errors import short, shown
from worker.core.registry import Registry
from worker.strategies.registry import BROKEN_PLUGINS, MODIFIERS, STRATEGIES, Kind, Param, Strategy

GROUP = "decodebench.strategies"
NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
STEP_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
PARAM_TYPES = (int, float, str, bool)


@dataclass(frozen=True)
class PluginProblem:
    """A plugin that was not registered: its entry point and the reason, as one line."""

    name: str
    entry_point: str  # "name = module:attr (distribution version)"
    reason: str

    @property
    def line(self) -> str:
        return f"plugin {self.entry_point}: not loaded: {self.reason}"


PROBLEMS: list[PluginProblem] = []


def load_plugins(
    entry_points: Iterable[Any] | None = None,
    registry: Registry[Strategy] = STRATEGIES,
    broken: dict[str, str] = BROKEN_PLUGINS,
    sink: list[PluginProblem] | None = PROBLEMS,
) -> list[PluginProblem]:
    """Register every plugin of the entry-point group (or of `entry_points`); the problems, one per
    plugin that was not registered (also appended to `sink`: the process's `PROBLEMS` by default)."""
    found = importlib.metadata.entry_points(group=GROUP) if entry_points is None else entry_points
    problems = []
    for ep in sorted(found, key=lambda e: e.name):
        where = _where(ep)
        try:
            strategy = _checked(ep, registry)
        except (Exception, SystemExit) as err:  # a plugin's failure is its line, never the caller's crash
            reason = err.reason if isinstance(err, _Refused) else f"{type(err).__name__}: {shown(str(err), 200)}"
            problem = PluginProblem(ep.name, where, reason)
            problems.append(problem)
            broken.setdefault(ep.name, f"strategy {short(ep.name)} comes from {problem.line}")
            continue
        registry.register(strategy.name, replace(strategy, plugin=where))
    if sink is not None:
        sink.extend(problems)
    return problems


def _where(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    origin = f" ({dist.name} {dist.version})" if dist is not None else ""
    return f"{ep.name[:100]} = {ep.value[:200]}{origin}"


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _checked(ep: Any, registry: Registry[Strategy]) -> Strategy:
    """The entry point's strategy once it passes every check; _Refused (or the import's error) if not."""
    if not NAME.fullmatch(ep.name):
        raise _Refused(f"entry point name {short(ep.name)} is not a strategy name (lower case, digits, _)")
    if ep.name in registry:
        owner = registry.get(ep.name).plugin
        raise _Refused(f"name clashes with {'the plugin ' + owner if owner else 'the built-in strategy'} {ep.name!r}")
    strategy = ep.load()
    if not isinstance(strategy, Strategy):
        raise _Refused(f"{type(strategy).__name__} is not a worker.strategies.Strategy")
    if strategy.name != ep.name:
        raise _Refused(f"the strategy is named {short(strategy.name)}, its entry point {ep.name!r}: give both one name")
    if not isinstance(strategy.description, str) or not strategy.description.strip():
        raise _Refused("description must be a non-empty string")
    if not isinstance(strategy.stochastic, bool):
        raise _Refused("stochastic must be true or false")
    _check_kind(strategy)
    for name, param in strategy.params.items():
        _check_param(name, param)
    _check_defaults(strategy)
    return strategy


def _check_kind(strategy: Strategy) -> None:
    if not isinstance(strategy.kind, Kind):
        valid = ", ".join(k.value for k in Kind)
        raise _Refused(f"unknown kind {short(strategy.kind)}; valid: worker.strategies.Kind ({valid})")
    if strategy.kind is Kind.CUSTOM:
        if not isinstance(strategy.step, str) or not STEP_REF.fullmatch(strategy.step):
            raise _Refused(f"kind custom needs step='module:Class' (its Step subclass), got {short(strategy.step)}")
        module = strategy.step.partition(":")[0]
        if importlib.util.find_spec(module) is None:
            raise _Refused(f"step module {module!r} is not installed")
    elif strategy.step:
        raise _Refused(f"step is for kind custom only; kind {strategy.kind.value} has the engine's own step")


def _check_param(name: Any, param: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise _Refused(f"parameter name {short(name)} is not an identifier")
    if name in MODIFIERS:
        raise _Refused(f"parameter {name!r} clashes with the modifier every strategy accepts")
    if not isinstance(param, Param):
        raise _Refused(f"parameter {name!r} is a {type(param).__name__}, not a worker.strategies.Param")
    if param.type not in PARAM_TYPES:
        raise _Refused(f"parameter {name!r} has type {short(param.type)}; valid: int, float, str, bool")
    if param.choices and param.type is not str:
        raise _Refused(f"parameter {name!r}: choices are for str parameters")
    if param.default is None and param.optional is False and param.type is bool:
        raise _Refused(f"parameter {name!r}: a bool parameter needs a default")
    if param.default is not None:
        try:
            param.check(name, param.default)
        except ValueError as err:
            raise _Refused(f"parameter {name!r}: its default fails its own check: {err}") from None


def _check_defaults(strategy: Strategy) -> None:
    """Where every parameter has a default, the defaults validate and map onto a generation config."""
    if any(p.default is None and not p.optional for p in strategy.params.values()):
        return
    try:
        kwargs = strategy.generation_kwargs({})
    except ValueError as err:
        raise _Refused(f"its defaults fail validation: {err}") from None
    if not isinstance(kwargs, dict):
        raise _Refused(f"to_config returned {type(kwargs).__name__}, not a dict of GenerationConfig settings")
    if kwargs.get("do_sample") is True and not strategy.stochastic:
        raise _Refused(
            "to_config samples (do_sample: true) but stochastic is false: it would run with the first seed only, "
            "its variation over seeds never measured; declare stochastic=True"
        )
