"""Errors of the control plane: the same hierarchy as the worker's, re-exported."""

from worker.errors import DecodebenchError, PermanentJobError, ServiceError, StoreError, UsageError

__all__ = ["DecodebenchError", "PermanentJobError", "ServiceError", "StoreError", "UsageError"]
