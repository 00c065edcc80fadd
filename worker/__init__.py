"""decodebench data plane: core (contract, settings, keys), store, strategies, sweep state,
the RQ worker and the engine (the only part that imports torch). docs/architecture.md."""

__version__ = "0.1.0"
