"""A job's structured log as the server and the CLI read it: from the store, its sweep found by id, prefix, Redis
or the store (controller.server.service for the rest of the server's operations)."""

from __future__ import annotations

from typing import Any

from controller.server.errors import NotFound, TooLarge
from controller.server.service import Context, resolve, tenant_of
from controller.server.tokens import Identity
from worker import sweepstate
from worker.core import paths, settings
from worker.core.errors import RecordTooLargeError


def job_log(ctx: Context, who: Identity, sweep: str | None, job: str) -> list[dict[str, Any]]:
    """A job's log lines from the store. Given its sweep (an id or a unique prefix), the store alone answers (logs
    outlive a sweep's Redis keys); else the sweep is looked up among the tenant's submitted sweeps in Redis, or,
    without Redis (a local store), among the store's sweeps."""
    tenant = tenant_of(who)
    paths.check_id("job", job)
    if sweep is not None:  # the id as given where the log is there (a spec.json can be gone), else a prefix
        paths.check_id("sweep", sweep)
        if not ctx.store.exists(paths.log_key(tenant, sweep, job)):
            sweep = resolve(ctx, tenant, sweep, stored=True)
    elif ctx.conn is not None:
        sweep = sweepstate.find_job_sweep(ctx.conn, tenant, job)
        if sweep is None:
            raise NotFound(f"job {job} is not in any submitted sweep of tenant {tenant!r}; give --sweep")
    elif (sweep := ctx.store.job_sweep(tenant, job)) is None:
        raise NotFound(f"no sweep of tenant {tenant!r} in {ctx.store.url} has a log of job {job}")
    key = paths.log_key(tenant, sweep, job)  # both ids checked: the key stays in the tenant's prefix
    if not ctx.store.exists(key):
        state = sweepstate.job_state(ctx.conn, tenant, sweep, job) if ctx.conn is not None else None
        raise NotFound(f"job {job} of sweep {sweep} has no log yet" + (f" (state: {state})" if state else ""))
    limit = int(settings.get("api_max_log_mb") * 2**20)
    try:
        return list(ctx.store.read_jsonl(key, limit))
    except RecordTooLargeError:
        raise TooLarge(
            f"job {job} of sweep {sweep}: its log is over the server's limit of {limit / 2**20:g} MiB "
            "(DECODEBENCH_API_MAX_LOG_MB); read it from the store"
        ) from None
