"""Decoding strategies: the registry (`registry`), the registered strategies and the plugins.

Importing this package registers every strategy: the built-ins, then the plugins of installed
packages (entry-point group `decodebench.strategies`, `worker.strategies.plugins`). Light: it never
imports torch. A plain strategy is a row of the table in `worker.strategies.table`: its parameters
map onto transformers `GenerationConfig` settings. Each strategy declares its `Kind`; the engine
maps a kind to the step that decodes it (`worker.engine.plan`), and a `Kind.CUSTOM` strategy names
its own step.
"""

from worker.strategies import assisted, contrastive, diverse_beam, table  # noqa: F401  (register the strategies)
from worker.strategies.registry import (
    BROKEN_PLUGINS,
    MODIFIERS,
    STRATEGIES,
    Kind,
    Param,
    Strategy,
    get_strategy,
    register,
    samples_label,
    variant_label,
)

__all__ = [
    "BROKEN_PLUGINS",
    "MODIFIERS",
    "STRATEGIES",
    "Kind",
    "Param",
    "Strategy",
    "get_strategy",
    "register",
    "samples_label",
    "variant_label",
]

from worker.strategies.plugins import PROBLEMS, load_plugins

load_plugins()
__all__ += ["PROBLEMS"]
