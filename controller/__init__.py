"""decodebench control plane: spec and plan, launch (local or RQ), metrics, reports,
operations and the `decodebench` CLI. Never imports torch. docs/architecture.md."""

__version__ = "0.1.0"
