"""Decoding strategies: the registry (`registry`) and the registered strategies.

Importing this package registers every strategy. Light: it never imports torch.
A plain strategy is a row of the table in `worker.strategies.table`: its parameters
map onto transformers `GenerationConfig` settings. Each strategy declares its `Kind`;
the engine maps a kind to the step that decodes it (`worker.engine.plan`).
"""

from worker.strategies import assisted, contrastive, diverse_beam, table  # noqa: F401  (register the strategies)
from worker.strategies.registry import (
    MODIFIERS,
    STRATEGIES,
    Kind,
    Param,
    Strategy,
    get_strategy,
    register,
    variant_label,
)

__all__ = ["MODIFIERS", "STRATEGIES", "Kind", "Param", "Strategy", "get_strategy", "register", "variant_label"]
