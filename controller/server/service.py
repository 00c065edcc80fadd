"""What the submission server does for a request, as plain functions over Redis and the store.

Every operation acts for one `Identity` (from its token): the tenant comes from the token,
never from the request. A submit is validated exactly as `decodebench validate` validates a
file, then held to the tenant's policy (every model a job loads, trust_remote_code, the cost
limits) and quota (queued jobs, queued payload bytes, sweeps in flight) before anything is
written; the check and the enqueue run under the tenant's submit lock, so two concurrent
submits cannot both pass the same quota.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.report.distribute.plancache import PlanMemo
from controller.server import quota
from controller.server.errors import Forbidden, NotFound
from controller.server.tokens import Identity
from worker import sweepstate
from worker.core import paths
from worker.core.contract import JobSpec, JobStatus
from worker.core.errors import UsageError
from worker.core.settings import DEFAULT_TENANT
from worker.core.tenants import Tenant, TenantsFile
from worker.sweepstate import reads as state_reads

MAX_FAILURES = 10_000  # failure reasons one `failures` answer lists at most


class SubmitRequest(BaseModel):
    """POST /v1/sweeps: a sweep already validated by the client, its prompts inline."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] = Field(description="The sweep spec as JSON, prompts inline (`prompts.inline`).")
    base_dir: str | None = Field(
        default=None,
        description="The spec file's absolute directory on the client: local model paths are "
        "taken relative to it in the sweep id, so a sweep has the same id however it is submitted.",
    )
    priority: Literal["high", "normal", "low"] = Field(default="normal", description="Queue priority.")
    retry_failed: bool = Field(default=False, description="Also enqueue the sweep's failed and cancelled jobs.")
    retries: int | None = Field(
        default=None, ge=0, le=10, description="Retries of a transient failure (default: DECODEBENCH_RETRY_INTERVALS)."
    )


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    priority: Literal["high", "normal", "low"] = Field(default="normal", description="Queue priority.")


class ReportCellsRequest(BaseModel):
    """POST /v1/sweeps/{sweep}/report-cells: the settings the cells' numbers depend on."""

    model_config = ConfigDict(extra="forbid")

    n_boot: int = Field(default=1000, ge=0, le=100_000, description="Bootstrap replicates of the intervals.")
    n_boot_corpus: int = Field(default=100, ge=0, le=100_000, description="Replicates of a half-sample metric.")
    seed: int = Field(default=0, ge=0, le=2**63, description="Seed of the intervals' draws.")


class ReportPairsRequest(ReportCellsRequest):
    """POST /v1/sweeps/{sweep}/report-pairs: the cells' settings and the comparisons' baseline."""

    baseline: str | None = Field(
        default=None, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]*$", description="A strategy name or a cell key."
    )


class ReportJudgesRequest(BaseModel):
    """POST /v1/sweeps/{sweep}/report-judges: nothing; the judge, its endpoint and its limits are the stored spec's."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class Context:
    """What every request runs with: Redis (as the server's user), the store, the signing key,
    the tenants file (None: one tenant, `default`), the cost limits, and what report planning
    remembers between a report's calls (controller.report.distribute.plancache)."""

    conn: Any
    store: Any
    signing_key: bytes
    tenants: TenantsFile | None
    limits: Any
    lock_s: float = 30.0
    plans: PlanMemo = field(default_factory=PlanMemo)  # report plans between a report's calls (cells, pairs)

    def policy(self, tenant: str) -> Tenant:
        found = self.tenants.get(tenant) if self.tenants else None
        if found is None:  # a token's tenant is checked against the tenants file when tokens are read
            return Tenant.model_construct(name=DEFAULT_TENANT)  # every default: no allowlist, default quota
        return found


def tenant_of(who: Identity) -> str:
    if who.tenant is None:
        raise Forbidden(f"token {who.token_id!r} is an admin token without a tenant: it cannot act on sweeps")
    return who.tenant


# -- submit and retry ------------------------------------------------------------------------


def parse_submission(req: SubmitRequest):
    """The request's spec, validated as `decodebench validate` does; the server reads no file a client names."""
    return client_spec(req.spec, req.base_dir, "sweep")


def client_spec(spec: dict, base_dir: Any, source: str):
    """A spec a client wrote (a request's, or a stored spec.json the tenant may have rewritten: every path
    of the server that plans reads its spec through here), validated as `decodebench validate` does; no
    file a client names is read, nothing on the server's disk is resolved."""
    from controller.sweep.load import parse_spec

    prompts = spec.get("prompts") if isinstance(spec, dict) else None
    if isinstance(prompts, dict) and prompts.get("path") is not None:
        raise UsageError(
            f"{source}: prompts.path: the server reads no file a client names; send the prompts inline "
            "(`decodebench submit --api` does)"
        )
    parsed = parse_spec(spec, source)  # no base_dir: nothing on the server's disk is resolved
    if base_dir is not None:
        absolute = isinstance(base_dir, str) and base_dir.startswith("/") and "\x00" not in base_dir
        if not absolute or len(base_dir) > 4096:
            raise UsageError(f"{source}: base_dir: must be an absolute path of at most 4096 characters")
        parsed.base_dir = PurePosixPath(base_dir)
    return parsed


def stored_client_spec(stored: dict, sweep_id: str):
    """A sweep's spec.json as `retry` plans it: with submit's checks (a request body's bounds, `client_spec`)."""
    from controller.sweep.load import check_data

    source, inner = f"stored spec of sweep {sweep_id}", stored.get("spec", stored)
    check_data(stored, source, level=0 if inner is not stored else 1)  # as `read_body` checks a request's
    return client_spec(inner, stored.get("base_dir") or None, source)


def check_policy(ctx: Context, tenant: str, jobs: list[JobSpec]) -> None:
    """Every cell's first job against the tenant's policy and the cost limits (Forbidden, one line)."""
    from worker.core import policy

    policy_of = ctx.tenants.get(tenant) if ctx.tenants else None  # no tenants file: the cost limits only
    seen: set[str] = set()
    for job in jobs:
        if job.cell in seen:
            continue
        seen.add(job.cell)
        why = policy.job_refusal(job, policy_of, ctx.limits)
        if why:
            raise Forbidden(f"cell {job.cell}: {why}")


def check_judge(ctx: Context, tenant: str, judge) -> None:
    """A sweep's judge against the operator's declared endpoints and the tenant's list (Forbidden, one line):
    an endpoint is a network address a worker calls, so a tenant names one, never a URL."""
    if judge is None:
        return
    if judge.url is not None:
        raise Forbidden("judge.url: a sweep submitted to the server names a declared judge endpoint, not a URL")
    if judge.template is not None:  # whoever reports would read it (and send it to the endpoint)
        raise Forbidden("judge.template: the server takes no file a client names; user templates are for local runs")
    if judge.local is not None:
        policy_of = ctx.tenants.get(tenant) if ctx.tenants else None
        if policy_of is not None and not policy_of.allows_model(judge.local.path, judge.local.revision):
            raise Forbidden(f"judge.local: model {judge.local.path!r} is not among tenant {tenant!r}'s models")
        return
    declared = ctx.tenants.judge(judge.endpoint) if ctx.tenants else None
    if declared is None:
        raise Forbidden(f"judge.endpoint: {judge.endpoint!r} is not a judge endpoint declared in the tenants file")
    if judge.endpoint not in ctx.policy(tenant).judges:
        raise Forbidden(f"judge.endpoint: tenant {tenant!r} may not use judge endpoint {judge.endpoint!r}")


def checked(ctx: Context, tenant: str, jobs: list[JobSpec]) -> None:
    """What every plan of the server passes before anything is written: the tenant's policy and the cost
    limits, then the context length where the model's files are readable here (the worker checks again)."""
    from controller.sweep.context import check_context

    check_policy(ctx, tenant, jobs)
    check_context(jobs)


def outcome(out) -> dict[str, Any]:
    return {
        "sweep_id": out.sweep_id,
        "queue": out.queue,
        "jobs": out.jobs,
        "enqueued": len(out.enqueued),
        "done": out.done,
        "pending": out.pending,
        "failed": out.failed,
        "new": out.new,
        "cancelled": out.cancelled,
    }


def submit(ctx: Context, who: Identity, req: SubmitRequest) -> dict[str, Any]:
    from controller.launch.local import save_sweep
    from controller.launch.submit import enqueue_jobs
    from controller.sweep.plan import plan, planned_size
    from controller.sweep.prompts import load_prompts

    tenant = tenant_of(who)
    spec = parse_submission(req)
    check_judge(ctx, tenant, spec.judge)
    prompts = load_prompts(spec.prompts)
    quota.precheck(ctx, tenant, *planned_size(spec, prompts))  # refused from counts before any job is built
    jobs = plan(spec, tenant, prompts)
    checked(ctx, tenant, jobs)
    sweep_id = jobs[0].sweep_id

    def admit(todo: list[JobSpec]) -> None:
        quota.admit(ctx, tenant, sweep_id, todo, records=len(jobs))
        save_sweep(ctx.store, spec, jobs, tenant, mode="distributed")

    with quota.Locked(ctx, tenant):
        out = enqueue_jobs(
            ctx.conn,
            jobs,
            tenant,
            req.priority,
            retry_failed=req.retry_failed,
            retries=req.retries,
            name=spec.name,
            key=ctx.signing_key,
            admit=admit,
        )
        if out.cancelled and not req.retry_failed:  # nothing enqueued (resumed only on purpose); its limits taken
            save_sweep(ctx.store, spec, jobs, tenant, mode="distributed")
    return {"tenant": tenant, **outcome(out)}


def retry(ctx: Context, who: Identity, sweep: str, req: RetryRequest) -> dict[str, Any]:
    from controller.launch.submit import retry as do_retry

    tenant = tenant_of(who)
    sweep_id = resolve(ctx, tenant, sweep)
    with quota.Locked(ctx, tenant):
        out = do_retry(
            ctx.conn,
            ctx.store,
            tenant,
            sweep_id,
            req.priority,
            key=ctx.signing_key,
            admit=lambda todo: quota.admit(ctx, tenant, sweep_id, todo),
            check=lambda jobs: checked(ctx, tenant, jobs),
            parse=lambda stored: stored_client_spec(stored, sweep_id),
        )
    return {"tenant": tenant, **outcome(out)}


def report_cells(ctx: Context, who: Identity, sweep: str, req: ReportCellsRequest) -> dict[str, Any]:
    """`report --distributed`: one signed map job per cell of the tenant's sweep missing from the report
    cache, on the tenant's report queue (controller.report.distribute.signer). The cells are built here from the
    store under the token's tenant, never from what the client sends; the answer lists their digests."""
    return _report_jobs(ctx, who, sweep, req.model_dump())


def report_pairs(ctx: Context, who: Identity, sweep: str, req: ReportPairsRequest) -> dict[str, Any]:
    """Then its paired comparisons: one job per (cell, baseline) pair missing from the cache whose cells
    are cached, planned here from the store likewise (controller.report.distribute.signer); held to the same quota."""
    return _report_jobs(ctx, who, sweep, req.model_dump() | {"pairs": True})


def report_judges(ctx: Context, who: Identity, sweep: str, req: ReportJudgesRequest) -> dict[str, Any]:
    """Then its judge requests: one job per share with a request missing from the cache (controller.judge.jobs),
    planned here from the stored spec and generations, the report's budget checked first, the endpoint still the
    tenant's to use; held to the same quota."""
    return _report_jobs(ctx, who, sweep, req.model_dump() | {"judges": True, "tenants": ctx.tenants})


def _report_jobs(ctx: Context, who: Identity, sweep: str, settings: dict) -> dict[str, Any]:
    tenant = tenant_of(who)
    sweep_id = resolve(ctx, tenant, sweep, stored=True)
    # two reports of a tenant cannot both pass the same quota: the lock from reading which jobs are queued to
    # writing the new ones, not while the sweep is planned from the store (seconds for a large sweep)
    from controller.report.distribute.signer import Admission, enqueue_report

    hold = Admission(lock=lambda: quota.Locked(ctx, tenant), check=lambda n: quota.admit_report(ctx, tenant, n))
    return enqueue_report(
        ctx.conn, ctx.store, ctx.signing_key, tenant, sweep_id, **settings, admission=hold, memo=ctx.plans
    )


# -- reads and cancel --------------------------------------------------------------------------


def resolve(ctx: Context, tenant: str, sweep: str, stored: bool = False) -> str:
    """A sweep id or a unique prefix of one, among the tenant's submitted sweeps (in Redis), or with `stored` among
    its sweeps in the store (a local run's too); an ambiguous prefix is a UsageError, no such sweep NotFound."""
    paths.check_id("sweep", sweep)  # UsageError (400, exit 2) for what no sweep id looks like
    try:
        return ctx.store.resolve_sweep(tenant, sweep) if stored else sweepstate.resolve_sweep(ctx.conn, tenant, sweep)
    except UsageError as err:
        if "ambiguous" in str(err):
            raise
        raise NotFound(str(err)) from None


def status_dict(s) -> dict[str, Any]:
    states = [x.value for x in JobStatus]
    return {
        "sweep_id": s.sweep_id,
        "name": s.name,
        "tenant": s.tenant,
        "queue": s.queue,
        "jobs": s.n_jobs,
        "cancelled": s.cancelled,
        "complete": s.complete,
        "cells": s.cells,
        "totals": {x: s.total(x) for x in states},
        "jobs_per_s": s.jobs_per_s,
        "tokens_per_s": s.tokens_per_s,
        "eta_s": s.eta_s,
        "failures": [{"job_id": j, "cell": c, "reason": r} for j, c, r in s.failures],
        "n_failures": s.n_failures,
        "lost": s.lost,
        "stale": s.stale,
        "problems": s.problems,
        "unavailable": [{"model": m, "reason": r, "jobs": n} for m, r, n in s.unavailable],
    }


def status(ctx: Context, who: Identity, sweep: str, max_failures: int = 20) -> dict[str, Any]:
    tenant = tenant_of(who)
    sweep_id = resolve(ctx, tenant, sweep)
    return status_dict(sweepstate.read_status(ctx.conn, tenant, sweep_id, max_failures=max_failures))


def failures(ctx: Context, who: Identity, sweep: str) -> dict[str, Any]:
    out = status(ctx, who, sweep, max_failures=MAX_FAILURES)
    keep = ("sweep_id", "n_failures", "failures", "unavailable")
    return {k: out[k] for k in keep}


def list_sweeps(ctx: Context, who: Identity) -> list[dict[str, Any]]:
    tenant = tenant_of(who)
    rows = []
    for sweep_id in sweepstate.submitted_sweeps(ctx.conn, tenant):
        meta = sweepstate.sweep_meta(ctx.conn, tenant, sweep_id)
        rows.append(
            {
                "sweep_id": sweep_id,
                "name": meta.get("name", ""),
                "jobs": int(meta.get("n_jobs", 0) or 0),
                "created_at": meta.get("created_at", ""),
                "cancelled": bool(meta.get("cancelled")),
            }
        )
    return rows


def cancel(ctx: Context, who: Identity, sweep: str) -> dict[str, Any]:
    tenant = tenant_of(who)
    sweep_id = resolve(ctx, tenant, sweep)
    out = sweepstate.cancel_sweep(ctx.conn, tenant, sweep_id)
    return {"sweep_id": sweep_id, "dropped": out.cancelled, "stopping": len(out.stopping), "idle": out.idle}


def tenants_overview(ctx: Context, who: Identity) -> list[dict[str, Any]]:
    from dataclasses import asdict

    if not who.admin:
        raise Forbidden(f"token {who.token_id!r} is not an admin token: only an admin reads every tenant's shares")
    # Declared tenants; a single-team deployment has whatever tenants its operator used.
    names = [t.name for t in ctx.tenants.tenants] if ctx.tenants else state_reads.known_tenants(ctx.conn)
    return [asdict(state_reads.tenant_overview(ctx.conn, t)) for t in names]
