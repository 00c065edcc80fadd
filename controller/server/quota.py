"""The tenant's quota at the submission server: what a tenant may hold in the shared Redis (worker.core.tenants
`Quota`), checked under the tenant's submit lock before anything is written (`Locked`, `admit`), and what a
new sweep's state is made room for (`make_room`). `ctx` is the server's `service.Context`."""

from __future__ import annotations

import time

import structlog

from controller.server.errors import Busy, OverQuota, TooLarge
from worker import sweepstate
from worker.core.contract import JobSpec
from worker.sweepstate import admission
from worker.sweepstate import reads as state_reads

log = structlog.get_logger("decodebench.server")


def precheck(ctx, tenant: str, n_jobs: int, min_bytes: int) -> None:
    """A sweep of `n_jobs` jobs whose payloads hold at least `min_bytes` (`controller.sweep.plan.planned_size`)
    refused from these counts, before it is planned or serialised, where it is larger than the tenant's whole
    quota: no submit of it could ever be admitted. `admit` checks exactly, under the submit lock, what passes
    (a sweep within the quota costs the server no more than the quota to plan)."""
    quota = ctx.policy(tenant).quota
    if n_jobs > quota.queued_jobs:
        raise OverQuota(
            f"over quota: the sweep plans {n_jobs} jobs; tenant {tenant}'s quota.queued_jobs is {quota.queued_jobs}"
        )
    if min_bytes > quota.queued_bytes:
        raise TooLarge(
            f"over quota: the sweep's job payloads hold at least {min_bytes / 2**20:.1f} MiB; tenant {tenant}'s "
            f"quota.queued_mb is {quota.queued_mb:g}"
        )


def admit(ctx, tenant: str, sweep_id: str, todo: list[JobSpec], records: int = 0) -> None:
    """Refuse, before anything is written, a submit that would take the tenant over its quota; `records`:
    the jobs the sweep's state records (quota.held_jobs, where the sweep is new)."""
    if not todo:
        return
    quota = ctx.policy(tenant).quota
    conn = ctx.conn
    queued = state_reads.queued_jobs(conn, tenant)
    if queued + len(todo) > quota.queued_jobs:
        raise OverQuota(
            f"over quota: tenant {tenant} has {queued} jobs queued, this sweep adds {len(todo)}; "
            f"quota.queued_jobs is {quota.queued_jobs}"
        )
    in_flight = state_reads.sweeps_in_flight(conn, tenant)
    if sweep_id not in in_flight and len(in_flight) >= quota.sweeps_in_flight:
        raise OverQuota(
            f"over quota: tenant {tenant} has {len(in_flight)} sweeps in flight; "
            f"quota.sweeps_in_flight is {quota.sweeps_in_flight}"
        )
    new_bytes = sum(len(j.model_dump_json()) for j in todo)  # uncompressed: an upper bound of what is stored
    held = state_reads.queued_payload_bytes(conn, tenant)
    if held + new_bytes > quota.queued_bytes:
        raise TooLarge(
            f"over quota: tenant {tenant} holds {held / 2**20:.1f} MiB of queued payloads, this sweep adds up to "
            f"{new_bytes / 2**20:.1f} MiB; quota.queued_mb is {quota.queued_mb:g}"
        )
    make_room(ctx, tenant, sweep_id, records, quota.held_jobs)


def make_room(ctx, tenant: str, sweep_id: str, records: int, most: int) -> None:
    """Keep what Redis records for the tenant under quota.held_jobs: a new sweep's jobs are made room for by
    forgetting the tenant's oldest sweeps with nothing queued or running (their results, logs and specs stay
    in the store); refused in one line where its live sweeps alone leave no room. Called last: a submit
    refused for another reason forgets nothing."""
    held = state_reads.held_sweeps(ctx.conn, tenant)
    if any(s == sweep_id for s, _, _ in held):
        return  # a known sweep records no new job
    total = sum(n for _, n, _ in held)
    idle = [(s, n) for s, n, busy in held if not busy]  # oldest first
    forgot = []
    while total + records > most and idle:
        old, n = idle.pop(0)
        sweepstate.forget_sweep(ctx.conn, tenant, old)
        total -= n
        forgot.append(old)
    if forgot:
        log.info("server.forgot_sweeps", tenant=tenant, sweeps=forgot, held_jobs=total)
    if total + records > most:
        raise OverQuota(
            f"over quota: tenant {tenant}'s sweeps with jobs queued or running record {total} jobs, this sweep "
            f"adds {records}; quota.held_jobs is {most}"
        )


class Locked:
    """The tenant's submit lock for the block: concurrent submits of a tenant take turns, each
    waiting up to the lock's lifetime; Busy (409, retry) if it is still held after that."""

    POLL_S = 0.02

    def __init__(self, ctx, tenant: str) -> None:
        self.ctx, self.tenant, self.owner = ctx, tenant, None

    def __enter__(self) -> None:
        deadline = time.monotonic() + self.ctx.lock_s
        while (owner := admission.take_submit_lock(self.ctx.conn, self.tenant, self.ctx.lock_s)) is None:
            if time.monotonic() >= deadline:
                raise Busy(f"another submit of tenant {self.tenant} is in progress; try again", retry_after=1.0)
            time.sleep(self.POLL_S)
        self.owner = owner

    def __exit__(self, *exc) -> None:
        admission.release_submit_lock(self.ctx.conn, self.tenant, self.owner)


def admit_report(ctx, tenant: str, new: int) -> None:
    """Refuse, before any is written, report jobs (cells and pairs, one queue) that would take the tenant over
    quota.queued_report_cells (a new seed or n_boot is a new set: without this, a token could fill the queue)."""
    most = ctx.policy(tenant).quota.queued_report_cells
    queued = state_reads.queued_report_cells(ctx.conn, tenant)
    if queued + new > most:
        raise OverQuota(
            f"over quota: tenant {tenant} has {queued} report jobs queued, this report adds {new}; "
            f"quota.queued_report_cells is {most}"
        )
