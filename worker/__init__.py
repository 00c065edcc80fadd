"""decodebench data plane: the job contract, the store, strategies, metrics and the engine.

Only `worker.engine`, `worker.job` (lazily) and the custom strategy loops import torch;
everything the controller imports from here is light.
"""

__version__ = "0.1.0"
