"""Decoding strategies: the registry (`registry`) and the registered strategies.

Importing this package registers every strategy. Light: it never imports torch.
A plain strategy is a row of the table in `worker.strategies.table`: its parameters
map onto transformers `GenerationConfig` settings. A strategy that needs a decoding
loop of its own names it in `loop` ("module:function", under `worker.engine.loops`),
imported only by the engine.
"""

from worker.strategies import assisted, contrastive, diverse_beam, table  # noqa: F401  (register the strategies)
from worker.strategies.registry import MODIFIERS, STRATEGIES, Param, Strategy, get_strategy, register, variant_label

__all__ = ["MODIFIERS", "STRATEGIES", "Param", "Strategy", "get_strategy", "register", "variant_label"]
