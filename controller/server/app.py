"""The submission server's HTTP layer (FastAPI on uvicorn): authentication, rate limit, size
limit, error mapping and one audit line per request. The work is `controller.server.service`.

Why FastAPI: it is the kept, typed ASGI framework of the Python ML ecosystem (vLLM's and
Ray Serve's HTTP fronts use it); pydantic models, which decodebench's contract already is,
validate its request bodies; uvicorn serves it with graceful shutdown. Endpoints are plain
`def` functions: FastAPI runs them on its thread pool, where the blocking Redis client is at
home.

Every answer that is not 2xx is `{"error": "<one line>"}`; 401 carries `WWW-Authenticate`,
a 409 (another submit holds the tenant's lock) or a rate-limit 429 carries `Retry-After`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Annotated

import structlog
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller.server import joblog, service
from controller.server.errors import ApiError, OverQuota, TooLarge, Unauthorized
from controller.server.tokens import Identity, TokenStore
from controller.sweep.load import check_data
from controller.sweep.yamlsafe import DuplicateKey, unique_keys
from worker.core import settings
from worker.core.errors import DecodebenchError, ServiceError, UsageError
from worker.sweepstate import admission

audit_log = structlog.get_logger("decodebench.audit")
log = structlog.get_logger("decodebench.server")
MAX_TOKEN_CHARS = 512


def _error(status: int, message: str, retry_after: float | None = None, **headers: str) -> JSONResponse:
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, int(retry_after + 0.999)))
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


def _validation_message(err: ValidationError, what: str) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or what
    return f"{what}: {where}: {first['msg']}"


def identify(request: Request) -> Identity:
    """The caller, from its bearer token; counts the request against the token's rate limit."""
    state = request.app.state
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("no bearer token: send `Authorization: Bearer <token>` (DECODEBENCH_TOKEN_FILE)")
    token = token.strip()
    who = state.tokens.identify(token, time.time()) if len(token) <= MAX_TOKEN_CHARS else None
    if who is None:
        raise Unauthorized("the token is not valid (unknown, revoked or mistyped)")
    request.state.who = who
    limit = state.ctx.policy(who.tenant or "").rate_limit
    n, wait = admission.count_request(state.ctx.conn, who.token_id, time.time())
    if n > limit:
        raise OverQuota(
            f"rate limit: token {who.token_id} made {n} requests this minute; the limit is {limit}", retry_after=wait
        )
    return who


# A JSON string (escapes included), matched in C. One that never closes runs to the end of the body: the
# pattern never fails at a quote, so the scan never starts again from the next quote inside it (which made a
# body of `"` and `\"` x 30,000 cost 15 s: each of its quotes a start, each start a scan to the end).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)


def json_values(body: bytes) -> int:
    """An upper bound of the values a JSON text holds (each object and array, and each member after the
    first, counts one), from its bytes outside strings: what parsing it would build, counted before.
    Linear in the body's length, whatever it holds."""
    bare = _STRING.sub(b"", body)
    return bare.count(b",") + bare.count(b"{") + bare.count(b"[")


async def _chunks(request: Request, limit: int, too_large: TooLarge) -> list[bytes]:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return chunks


async def read_body(request: Request) -> dict:
    """The JSON body, refused before parsing if it is larger than the limit or is not sent within the body
    timeout, then read by `parse_body` on the thread pool: a large body is CPU time that the event loop,
    which answers every tenant's requests, must not spend."""
    state = request.app.state
    limit = state.max_request_bytes
    too_large = TooLarge(f"request body over the limit of {limit / 2**20:g} MiB (DECODEBENCH_API_MAX_REQUEST_MB)")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise too_large
    try:
        async with asyncio.timeout(state.body_timeout_s):
            body = b"".join(await _chunks(request, limit, too_large))
    except TimeoutError:
        raise ApiError(
            f"request body not received within {state.body_timeout_s:g} s (DECODEBENCH_API_BODY_TIMEOUT_S)", 408
        ) from None
    return await run_in_threadpool(parse_body, body, state.max_request_items)


def parse_body(body: bytes, max_items: int) -> dict:
    """A body's JSON object: refused before parsing if it holds more values than `max_items`, and after
    if it is not an object or breaks what a sweep file may hold (`check_data`: nested deeper, or text that
    is not valid Unicode anywhere in it), in one line."""
    if (n := json_values(body)) > max_items:
        raise TooLarge(
            f"request body: {n:,} JSON values or more, over the limit of {max_items:,} "
            "(DECODEBENCH_API_MAX_REQUEST_ITEMS)"
        )
    try:
        data = json.loads(body or b"{}", object_pairs_hook=unique_keys)
    except DuplicateKey as err:  # the last one kept in silence: refused as in a sweep file
        raise UsageError(f"request body: {err}") from None
    except (ValueError, RecursionError) as err:
        raise UsageError(f"request body: not JSON ({str(err)[:80]})") from None
    if not isinstance(data, dict):
        raise UsageError("request body: must be a JSON object")
    check_data(data, "request body", level=0)  # its members (the spec) count levels as a sweep file's root
    return data


async def audit(request: Request, call_next):
    """One audit line per request: who (token id, tenant), what, which sweep, the answer. A bug is answered
    here (`on_bug`), inside this middleware: a handler registered for Exception runs outside every middleware,
    after this line would have been lost, and uvicorn would log the traceback a second time."""
    started = time.perf_counter()
    request.state.request_id = uuid.uuid4().hex[:12]
    try:
        response = await call_next(request)
    except Exception as err:
        response = await on_bug(request, err)
    who: Identity | None = getattr(request.state, "who", None)
    audit_log.info(
        "audit",
        request_id=request.state.request_id,
        action=getattr(request.state, "action", request.url.path[:80]),
        tenant=who.tenant if who else None,
        user=who.token_id if who else None,
        sweep_id=getattr(request.state, "sweep_id", None),
        status=response.status_code,
        result=getattr(request.state, "error", "ok")[:AUDIT_RESULT_CHARS],
        ms=round((time.perf_counter() - started) * 1000, 1),
    )
    return response


AUDIT_RESULT_CHARS = 500  # an error's first characters in its audit line: a client's text never fills the log


def _answer(request: Request, status: int, message: str, retry_after: float | None = None, **headers: str):
    request.state.error = message
    return _error(status, message, retry_after, **headers)


async def on_api_error(request: Request, err: ApiError):
    extra = {"WWW-Authenticate": "Bearer"} if err.status == 401 else {}
    return _answer(request, err.status, str(err), err.retry_after, **extra)


async def on_usage_error(request: Request, err: UsageError):
    return _answer(request, 400, str(err))


async def on_invalid(request: Request, err: ValidationError):
    return _answer(request, 400, _validation_message(err, "request body"))


async def on_http_error(request: Request, err: StarletteHTTPException):
    """The framework's own refusals (no such path, a method the path does not take) in the server's shape."""
    return _answer(request, err.status_code, str(err.detail), **(err.headers or {}))


async def on_bad_parameters(request: Request, err: RequestValidationError):
    first = err.errors()[0] if err.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ())) or "request"
    return _answer(request, 400, f"{where}: {first.get('msg', 'invalid')}")


async def on_redis_error(request: Request, err: RedisError):
    log.warning("server.redis_error", error=str(err)[:200])
    return _answer(request, 503, "the queue (Redis) is unavailable; try again", retry_after=2)


async def on_service_error(request: Request, err: ServiceError):
    return _answer(request, 503, str(err), retry_after=2)


async def on_other_error(request: Request, err: DecodebenchError):
    return _answer(request, 500, str(err))


async def on_bug(request: Request, err: Exception):
    rid = getattr(request.state, "request_id", "?")
    log.error("server.internal_error", request_id=rid, exc_info=err)  # its traceback once, without locals
    return _answer(request, 500, f"internal error (request {rid}); the server's log has the details")


def _body(model) -> dict:
    """The OpenAPI `requestBody` of an endpoint that reads its body itself (`read_body`: bounded before parsing)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


Caller = Annotated[Identity, Depends(identify)]
# Most specific first: Starlette looks a handler up along the exception's class hierarchy.
HANDLERS = {
    ApiError: on_api_error,
    UsageError: on_usage_error,
    ValidationError: on_invalid,
    RequestValidationError: on_bad_parameters,
    StarletteHTTPException: on_http_error,
    RedisError: on_redis_error,
    ServiceError: on_service_error,
    DecodebenchError: on_other_error,
}  # and any other exception: `on_bug`, from `audit`
router = APIRouter()


def _ctx(request: Request, action: str, sweep: str | None = None) -> service.Context:
    request.state.action, request.state.sweep_id = action, sweep
    return request.app.state.ctx


@router.get("/healthz")
def healthz() -> dict:
    return {"ok": True}


@router.get("/readyz")
def readyz(request: Request) -> dict:
    request.app.state.ctx.conn.ping()
    return {"ok": True}


@router.get("/v1/whoami")
def whoami(request: Request, who: Caller) -> dict:
    _ctx(request, "whoami")
    return {"token_id": who.token_id, "tenant": who.tenant, "admin": who.admin}


@router.post("/v1/sweeps", openapi_extra=_body(service.SubmitRequest))
async def submit(request: Request, who: Caller):
    ctx = _ctx(request, "submit")
    req = service.SubmitRequest.model_validate(await read_body(request))
    out = await run_in_threadpool(service.submit, ctx, who, req)
    request.state.sweep_id = out["sweep_id"]
    return JSONResponse(out, status_code=201 if out["new"] else 200)


@router.get("/v1/sweeps")
def sweeps(request: Request, who: Caller) -> list:
    return service.list_sweeps(_ctx(request, "list"), who)


@router.get("/v1/sweeps/{sweep}")
def status(sweep: str, request: Request, who: Caller) -> dict:
    return service.status(_ctx(request, "status", sweep), who, sweep)


@router.get("/v1/sweeps/{sweep}/failures")
def failures(sweep: str, request: Request, who: Caller) -> dict:
    return service.failures(_ctx(request, "failures", sweep), who, sweep)


@router.post("/v1/sweeps/{sweep}/cancel")
def cancel(sweep: str, request: Request, who: Caller) -> dict:
    return service.cancel(_ctx(request, "cancel", sweep), who, sweep)


@router.post("/v1/sweeps/{sweep}/retry", openapi_extra=_body(service.RetryRequest))
async def retry(sweep: str, request: Request, who: Caller) -> dict:
    ctx = _ctx(request, "retry", sweep)
    req = service.RetryRequest.model_validate(await read_body(request))
    return await run_in_threadpool(service.retry, ctx, who, sweep, req)


@router.post("/v1/sweeps/{sweep}/report-cells", openapi_extra=_body(service.ReportCellsRequest))
async def report_cells(sweep: str, request: Request, who: Caller) -> dict:
    ctx = _ctx(request, "report-cells", sweep)
    req = service.ReportCellsRequest.model_validate(await read_body(request))
    return await run_in_threadpool(service.report_cells, ctx, who, sweep, req)


@router.post("/v1/sweeps/{sweep}/report-pairs", openapi_extra=_body(service.ReportPairsRequest))
async def report_pairs(sweep: str, request: Request, who: Caller) -> dict:
    ctx = _ctx(request, "report-pairs", sweep)
    req = service.ReportPairsRequest.model_validate(await read_body(request))
    return await run_in_threadpool(service.report_pairs, ctx, who, sweep, req)


@router.post("/v1/sweeps/{sweep}/report-judges", openapi_extra=_body(service.ReportJudgesRequest))
async def report_judges(sweep: str, request: Request, who: Caller) -> dict:
    ctx = _ctx(request, "report-judges", sweep)
    req = service.ReportJudgesRequest.model_validate(await read_body(request))
    return await run_in_threadpool(service.report_judges, ctx, who, sweep, req)


@router.get("/v1/jobs/{job}/log")
def job_log(job: str, request: Request, who: Caller, sweep: str | None = None) -> JSONResponse:
    # JSONResponse: the lines as json.dumps writes them, not through FastAPI's per-value encoder (a log of
    # many short lines cost the server seconds of CPU there)
    return JSONResponse(joblog.job_log(_ctx(request, "logs", sweep), who, sweep, job))


@router.get("/v1/tenants")
def tenants(request: Request, who: Caller) -> list:
    return service.tenants_overview(_ctx(request, "tenants"), who)


def openapi(request: Request, who: Caller) -> JSONResponse:
    """The API's OpenAPI schema, to a valid token only, where DECODEBENCH_API_OPENAPI is on."""
    _ctx(request, "openapi")
    return JSONResponse(request.app.openapi())


def create_app(ctx: service.Context, tokens: TokenStore, max_request_bytes: int) -> FastAPI:
    """The server's ASGI app over one Context (Redis, store, key, tenants, limits) and the tokens. No
    schema or docs page answers without a token: /openapi.json only where DECODEBENCH_API_OPENAPI is on."""
    app = FastAPI(title="decodebench submission server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx, app.state.tokens, app.state.max_request_bytes = ctx, tokens, max_request_bytes
    app.state.max_request_items = settings.get("api_max_request_items")
    app.state.body_timeout_s = settings.get("api_body_timeout_s")
    if settings.get("api_openapi"):
        app.add_api_route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)
    app.middleware("http")(audit)
    for kind, handler in HANDLERS.items():
        app.add_exception_handler(kind, handler)
    app.include_router(router)
    return app
