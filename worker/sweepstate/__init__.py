"""A sweep's job states in Redis: every write (`transitions`) and every read (`reads`).

The worker's task and reaper and the controller's submit, status and cancel all go
through here (and `unavailable`: the models a sweep cannot load, marked by workers); no
other module touches decodebench's state keys.
"""

from worker.sweepstate.reads import (
    SweepStatus,
    find_job_sweep,
    is_cancelled,
    job_state,
    job_states,
    known_tenants,
    read_status,
    read_unavailable,
    resolve_sweep,
    stale_runs,
    submitted_sweeps,
    sweep_meta,
)
from worker.sweepstate.transitions import (
    NONE,
    CancelOutcome,
    cancel_sweep,
    claim_lost,
    expire_sweep,
    forget_job,
    forget_losses,
    forget_sweep,
    heartbeat_job,
    prune_expired_sweeps,
    record_loss,
    register_sweep,
    transition,
    transition_many,
)
from worker.sweepstate.unavailable import gate_models, loaded_model, mark_unavailable

__all__ = [
    "stale_runs",
    "NONE",
    "CancelOutcome",
    "SweepStatus",
    "cancel_sweep",
    "claim_lost",
    "expire_sweep",
    "find_job_sweep",
    "forget_job",
    "forget_losses",
    "forget_sweep",
    "heartbeat_job",
    "is_cancelled",
    "job_state",
    "job_states",
    "known_tenants",
    "prune_expired_sweeps",
    "read_status",
    "read_unavailable",
    "gate_models",
    "loaded_model",
    "mark_unavailable",
    "record_loss",
    "register_sweep",
    "resolve_sweep",
    "submitted_sweeps",
    "sweep_meta",
    "transition",
    "transition_many",
]
