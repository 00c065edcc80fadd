"""Where a distributed-mode command goes: the submission server (`--api`), or Redis directly.

Both answer with the same JSON, from the same code: `Remote` sends the request to the server,
which runs `controller.server.service`; `Direct` runs that very service in this process as
the operator (the Redis user of DECODEBENCH_REDIS_URL, the signing key of
DECODEBENCH_SIGNING_KEY_FILE), with the same validation, policy and quotas, and logs the
audit line the server would.
"""

from __future__ import annotations

from urllib.parse import quote

import click

from worker.core import settings
from worker.core.errors import UsageError
from worker.core.safetext import terminal


def no_tenant_flag() -> None:
    """With --api the tenant comes from the token: a --tenant on the command line is a mistake."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source("tenant") == click.core.ParameterSource.COMMANDLINE:
        raise UsageError("--tenant: with --api the tenant comes from your token; drop --tenant")


class Remote:
    def __init__(self, api: str) -> None:
        from controller.server.client import connect

        no_tenant_flag()
        self.where = f"through {terminal(api)}"
        self.client = connect(api)

    def audit(self, action: str, out: dict) -> None:
        """The server wrote the audit line."""

    def submit(self, body: dict) -> dict:
        return self.client.call("POST", "/v1/sweeps", body)

    def status(self, sweep: str) -> dict:
        return self.client.call("GET", f"/v1/sweeps/{quote(sweep, safe='')}")

    def failures(self, sweep: str) -> dict:
        return self.client.call("GET", f"/v1/sweeps/{quote(sweep, safe='')}/failures")

    def cancel(self, sweep: str) -> dict:
        return self.client.call("POST", f"/v1/sweeps/{quote(sweep, safe='')}/cancel")

    def retry(self, sweep: str, priority: str) -> dict:
        return self.client.call("POST", f"/v1/sweeps/{quote(sweep, safe='')}/retry", {"priority": priority})

    def report_cells(self, sweep: str, body: dict) -> dict:
        return self.client.call("POST", f"/v1/sweeps/{quote(sweep, safe='')}/report-cells", body)

    def report_pairs(self, sweep: str, body: dict) -> dict:
        return self.client.call("POST", f"/v1/sweeps/{quote(sweep, safe='')}/report-pairs", body)

    def report_judges(self, sweep: str, body: dict) -> dict:
        return self.client.call("POST", f"/v1/sweeps/{quote(sweep, safe='')}/report-judges", body)

    def job_log(self, sweep: str | None, job: str) -> list[dict]:
        query = f"?sweep={quote(sweep, safe='')}" if sweep else ""
        return self.client.call("GET", f"/v1/jobs/{quote(job, safe='')}/log{query}")

    def tenants(self) -> list[dict]:
        return self.client.call("GET", "/v1/tenants")

    def sweeps(self) -> list[dict]:
        return self.client.call("GET", "/v1/sweeps")


class Direct:
    """The service in-process, as the operator acting for `tenant`. Redis, the store and the
    signing key are opened when a command needs them (`logs --sweep` reads the store only)."""

    def __init__(self, redis_url: str, store_url: str, tenant: str) -> None:
        from controller.server.service import Context
        from controller.server.tokens import Identity
        from worker.core import policy
        from worker.core.redisconn import redis_user
        from worker.core.tenants import load_tenants

        path = settings.get("tenants_file")
        self.redis_url, self.store_url, self.tenant = redis_url, store_url, tenant
        self.ctx = Context(
            conn=None,
            store=None,
            signing_key=b"",
            tenants=load_tenants(path) if path else None,
            limits=policy.Limits.from_settings(),
            lock_s=settings.get("submit_lock_s"),
        )
        self.who = Identity(token_id=_operator(redis_user(redis_url)), tenant=tenant, admin=True)

    @property
    def where(self) -> str:
        return f"store {terminal(self._with(store=True).store.url)}"

    def _with(self, *, redis: bool = False, store: bool = False, key: bool = False):
        """The context, with what the command needs opened."""
        if redis and self.ctx.conn is None:
            from worker.core.redisconn import connect

            self.ctx.conn = connect(self.redis_url)
        if store and self.ctx.store is None:
            from worker.store import open_store

            self.ctx.store = open_store(self.store_url)
        if key and not self.ctx.signing_key:
            from worker.core.signing import load_key

            self.ctx.signing_key = load_key(settings.get("signing_key_file"))
        return self.ctx

    def audit(self, action: str, out: dict) -> None:
        """The audit line the server would write, after the command printed its answer."""
        import structlog

        fields = {k: out[k] for k in ("enqueued", "queue", "dropped", "stopping") if k in out}
        structlog.get_logger("decodebench.audit").info(
            "audit", action=action, tenant=self.tenant, user=self.who.token_id, sweep_id=out["sweep_id"], **fields
        )

    def submit(self, body: dict) -> dict:
        from controller.server import service

        ctx = self._with(redis=True, store=True, key=True)
        return service.submit(ctx, self.who, service.SubmitRequest.model_validate(body))

    def status(self, sweep: str) -> dict:
        from controller.server import service

        return service.status(self._with(redis=True), self.who, sweep)

    def failures(self, sweep: str) -> dict:
        from controller.server import service

        return service.failures(self._with(redis=True), self.who, sweep)

    def cancel(self, sweep: str) -> dict:
        from controller.server import service

        return service.cancel(self._with(redis=True), self.who, sweep)

    def retry(self, sweep: str, priority: str) -> dict:
        from controller.server import service

        ctx = self._with(redis=True, store=True, key=True)
        return service.retry(ctx, self.who, sweep, service.RetryRequest(priority=priority))

    def report_cells(self, sweep: str, body: dict) -> dict:
        from controller.server import service

        ctx = self._with(redis=True, store=True, key=True)
        return service.report_cells(ctx, self.who, sweep, service.ReportCellsRequest.model_validate(body))

    def report_pairs(self, sweep: str, body: dict) -> dict:
        from controller.server import service

        ctx = self._with(redis=True, store=True, key=True)
        return service.report_pairs(ctx, self.who, sweep, service.ReportPairsRequest.model_validate(body))

    def report_judges(self, sweep: str, body: dict) -> dict:
        from controller.server import service

        ctx = self._with(redis=True, store=True, key=True)
        return service.report_judges(ctx, self.who, sweep, service.ReportJudgesRequest.model_validate(body))

    def job_log(self, sweep: str | None, job: str) -> list[dict]:
        """Without --sweep, the job's sweep is the one whose log of it a local store holds, else looked up in Redis
        (a submitted job that has not run yet); a local run's jobs are in no Redis: where none answers, the store's
        answer stands."""
        from controller.server import joblog
        from worker.core import paths
        from worker.core.errors import ServiceError

        paths.check_id("job", job)
        ctx = self._with(store=True)
        local = ctx.store.url.startswith("file://")
        sweep = sweep or (ctx.store.job_sweep(self.tenant, job) if local else None)
        if sweep is None:
            try:
                ctx = self._with(redis=True)
            except ServiceError:
                if not local:
                    raise
        return joblog.job_log(ctx, self.who, sweep, job)

    def tenants(self) -> list[dict]:
        from controller.server import service

        return service.tenants_overview(self._with(redis=True), self.who)

    def sweeps(self) -> list[dict]:
        from controller.server import service

        return service.list_sweeps(self._with(redis=True), self.who)


def _operator(user: str | None) -> str:
    import getpass

    return f"redis:{user}" if user else f"os:{getpass.getuser()}"


def backend(api: str | None, redis_url: str, store: str, tenant: str) -> Remote | Direct:
    return Remote(api) if api else Direct(redis_url, store, tenant)
