"""The strategy registry: parameters, strategies, `STRATEGIES`. Light: never imports torch.

A plain strategy is a row of the table in `worker.strategies.table`: its parameters
map onto transformers `GenerationConfig` settings. Every strategy declares its `kind`
(`Kind`): how a token is chosen, which the engine maps to the step that decodes it
(`worker.engine.plan.STEPS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from worker.core.errors import UsageError, short
from worker.core.registry import Registry

# What the backend takes for an integer parameter without bounds of its own (a C int).
INT_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class Param:
    """One strategy parameter: its type, default, bounds and meaning."""

    type: type
    default: Any
    description: str
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    optional: bool = False  # default None means "off"
    choices: tuple[str, ...] = ()  # for str parameters
    is_path: bool = False  # a model path or hub id, resolved like `models[].path`

    def check(self, name: str, value: Any) -> Any:
        """Return the value coerced to the type, or raise ValueError naming the parameter."""
        if value is None and self.optional:
            return None
        if self.type is str:
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty string, got {short(value)}")
            if self.choices and value not in self.choices:
                raise ValueError(f"{name} must be one of {', '.join(self.choices)}, got {short(value)}")
            return value
        if self.type is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {short(value)}")
            return value
        return self._bounded(name, self._number(name, value))

    def _number(self, name: str, value: Any) -> int | float:
        """The value as this parameter's number type: finite, and an int within what the backend takes."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {short(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.type is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{name} must be an integer, got {value!r}")
            value = int(value)
            if self.max is None and abs(value) > INT_LIMIT:
                raise ValueError(f"{name} must be between -{INT_LIMIT} and {INT_LIMIT}, got {short(value)}")
            return value
        try:
            return float(value)
        except OverflowError:  # an int past the float range, e.g. 10**400
            raise ValueError(f"{name} is too large for a number, got {short(value)}") from None

    def _bounded(self, name: str, value: int | float) -> int | float:
        if self.min is not None and (value < self.min or (self.min_exclusive and value == self.min)):
            raise ValueError(f"{name} must be {'>' if self.min_exclusive else '>='} {self.min}, got {short(value)}")
        if self.max is not None and (value > self.max or (self.max_exclusive and value == self.max)):
            raise ValueError(f"{name} must be {'<' if self.max_exclusive else '<='} {self.max}, got {short(value)}")
        return value

    def describe(self) -> str:
        lo = "" if self.min is None else f"{'>' if self.min_exclusive else '>='}{self.min}"
        hi = "" if self.max is None else f"{'<' if self.max_exclusive else '<='}{self.max}"
        bounds = ", ".join(b for b in (lo, hi) if b) or " | ".join(self.choices)
        default = ("off" if self.optional else "required") if self.default is None else repr(self.default)
        return f"{self.type.__name__}{f' ({bounds})' if bounds else ''}, default {default}: {self.description}"


class Kind(str, Enum):
    """How a strategy chooses its tokens; the engine maps each kind to one step (worker.engine.plan)."""

    TOKEN = "token"  # one token per row and step: greedy search and every sampling strategy
    BEAM = "beam"  # beam search, one group (transformers' own where the engine cannot run it)
    DIVERSE_BEAM = "diverse_beam"  # beam search in groups with a diversity penalty (only the engine runs it)
    CONTRASTIVE = "contrastive"  # k candidates scored by confidence and degeneration (only the engine runs it)
    ASSISTED = "assisted"  # speculative decoding with a draft model (transformers' generate())
    CUSTOM = "custom"  # the strategy's own step of the decode loop (`Strategy.step`: a plugin's, docs/sweeps.md)


# The least temperature or repetition penalty: the float32 scores are divided by it, and below it they can overflow to
# inf, whose softmax is NaN (transformers' multinomial raises on it; the engine's inverse-CDF draw returned the
# vocabulary's last token at every step). A temperature's limit towards 0 is greedy search.
MIN_DIVISOR = 1e-5
# Every warper transformers builds for sampling, off: a sampling config takes these where it sets no other value, so
# that a checkpoint's generation_config (top_k 50, min_p, typical_p ...) never adds a filter the variant does not name.
WARPERS_OFF: dict[str, Any] = {
    "top_k": 0,
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
}
# Modifiers every strategy accepts, and the GenerationConfig value of each when a variant leaves it off (a
# checkpoint's generation_config, e.g. repetition_penalty 1.05, never applies to a variant that does not ask).
MODIFIERS_OFF: dict[str, Any] = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0}
MODIFIERS: dict[str, Param] = {
    "repetition_penalty": Param(
        float, None, "CTRL repetition penalty (>1 discourages repeats)", min=MIN_DIVISOR, optional=True
    ),
    "no_repeat_ngram_size": Param(int, None, "forbid repeating any n-gram of this size", min=1, optional=True),
}


@dataclass(frozen=True)
class Strategy:
    """A registered decoding strategy."""

    name: str
    description: str
    params: dict[str, Param]
    stochastic: bool
    to_config: Callable[[dict[str, Any]], dict[str, Any]]
    kind: Kind = Kind.TOKEN
    citation: str = ""
    # Kind.CUSTOM: "module:Class" of the step (a worker.engine.custom.TokenStep or choose.Chooser subclass) in
    # the installed package that declares the strategy; imported by the engine only, never named by a sweep
    step: str = ""
    plugin: str = ""  # where a plugin's strategy comes from: "<name> = <module:attr> (<distribution> <version>)"
    all_params: dict[str, Param] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "all_params", {**self.params, **MODIFIERS})

    def validate(self, params: dict[str, Any]) -> dict[str, Any]:
        """Fill defaults and check every value; raise ValueError naming the parameter."""
        unknown = sorted(set(params) - set(self.all_params))
        if unknown:
            raise ValueError(
                f"unknown parameter {unknown[0]!r} for strategy {self.name!r}; "
                f"valid: {', '.join(sorted(self.all_params))}"
            )
        out = {}
        for name, spec in self.all_params.items():
            value = params.get(name, spec.default)
            if value is None and spec.optional:
                continue
            if value is None:
                raise ValueError(f"{name} is required for strategy {self.name!r}")
            out[name] = spec.check(name, value)
        self.check_together(out)
        return out

    def check_together(self, params: dict[str, Any]) -> None:
        """Rules that span several parameters (ValueError); `params` are checked, defaults filled."""

    @property
    def has_joint_rules(self) -> bool:
        return type(self).check_together is not Strategy.check_together

    def generation_kwargs(self, params: dict[str, Any]) -> dict[str, Any]:
        """The GenerationConfig settings of params (validated, defaults filled, modifiers included), with every
        warper of a sampling config and every modifier it does not set turned off (`WARPERS_OFF`, `MODIFIERS_OFF`)."""
        params = self.validate(params)
        kwargs = self.to_config(params)
        if kwargs.get("do_sample"):
            kwargs = {**WARPERS_OFF, **kwargs}
        for name in MODIFIERS:
            if params.get(name) is not None:
                kwargs[name] = params[name]
            else:
                kwargs.setdefault(name, MODIFIERS_OFF[name])
        return kwargs


STRATEGIES: Registry[Strategy] = Registry("strategy")
# What the literature and other libraries call them: an unknown name among these is answered with ours.
STRATEGIES.aliases.update(
    {"nucleus": "top_p", "nucleus_sampling": "top_p", "topp": "top_p", "topk": "top_k", "top_k_sampling": "top_k",
     "sampling": "sample", "multinomial": "sample", "ancestral": "sample", "random": "sample",
     "beam_search": "beam", "greedy_search": "greedy", "argmax": "greedy", "typical_p": "typical",
     "locally_typical": "typical", "minp": "min_p", "contrastive_search": "contrastive",
     "eta_sampling": "eta", "epsilon_sampling": "epsilon"}
)  # fmt: skip


def register(strategy: Strategy) -> Strategy:
    return STRATEGIES.register(strategy.name, strategy)


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES and name in BROKEN_PLUGINS:  # a plugin that failed to load: say why
        raise UsageError(BROKEN_PLUGINS[name])
    return STRATEGIES.get(name)


# a plugin's entry point name -> the one line saying why its strategy is not registered (worker.strategies.plugins)
BROKEN_PLUGINS: dict[str, str] = {}


def variant_label(name: str, params: dict[str, Any]) -> str:
    """A short human label, e.g. `top_p(p=0.9,temperature=1.0)`."""
    if not params:
        return name
    return f"{name}({','.join(f'{k}={v}' for k, v in sorted(params.items()))})"


def samples_label(samples: int | None, best_of: str | None = None) -> str:
    """What follows a variant's label where it has samples: `[samples=8]`, `[best_of=8,by=model]`; else ""."""
    if samples is None:
        return ""
    return f"[best_of={samples},by={best_of}]" if best_of else f"[samples={samples}]"
