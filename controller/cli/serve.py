"""`decodebench serve` (the submission server) and `decodebench tokens new|hash` (its tokens file)."""

from __future__ import annotations

import click

from controller.cli import options
from worker.core import settings
from worker.core.errors import UsageError


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 in a pod).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="Port to listen on.")
@settings.option("tokens_file")
@settings.option("signing_key_file")
@settings.option("tenants_file")
@settings.option("api_max_request_mb", type=click.FloatRange(0.01, 4096))
@settings.option("tls_cert_file")
@settings.option("tls_key_file")
@settings.option("metrics_port", type=click.IntRange(0, 65535))
@options.redis_url
@options.store
def serve(
    host: str,
    port: int,
    tokens_file: str | None,
    signing_key_file: str | None,
    tenants_file: str | None,
    api_max_request_mb: float,
    tls_cert_file: str | None,
    tls_key_file: str | None,
    metrics_port: int,
    redis_url: str,
    store: str,
) -> None:
    """Run the submission server: the only client that writes sweeps to Redis (docs/tenants.md).

    With --tls-cert-file and --tls-key-file it serves HTTPS itself (clusters without an ingress
    controller); with --metrics-port, Prometheus metrics on a port of their own."""
    import uvicorn

    from controller.server.app import create_app
    from controller.server.edges import uvicorn_options
    from controller.server.metrics import ServerMetrics, instrument
    from controller.server.service import Context
    from controller.server.tokens import TokenStore
    from worker.core import policy
    from worker.core.redisconn import connect
    from worker.core.signing import load_key
    from worker.core.tenants import load_tenants
    from worker.store import open_store

    if not tokens_file:
        raise UsageError("--tokens-file: the server needs a tokens file (DECODEBENCH_TOKENS_FILE); see `tokens new`")
    if not signing_key_file:
        raise UsageError(
            "--signing-key-file: the server signs every job for the workers (DECODEBENCH_SIGNING_KEY_FILE)"
        )
    tls = _tls_options(tls_cert_file, tls_key_file)
    tenants = load_tenants(tenants_file) if tenants_file else None
    ctx = Context(
        conn=connect(redis_url),
        store=open_store(store),
        signing_key=load_key(signing_key_file),
        tenants=tenants,
        limits=policy.Limits.from_settings(),
        lock_s=settings.get("submit_lock_s"),
    )
    app = create_app(ctx, TokenStore(tokens_file, tenants), int(api_max_request_mb * 2**20))
    if metrics_port:
        metrics = ServerMetrics(ctx.conn)
        instrument(app, metrics)
        metrics.serve(metrics_port, host)
    # The audit middleware logs every request: uvicorn's access log would say it twice. The edges (header
    # and body timeouts, the connection limit) are controller.server.edges.
    options = {**uvicorn_options(), **tls}
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False, timeout_graceful_shutdown=10, **options)


def _tls_options(cert: str | None, key: str | None) -> dict:
    """uvicorn's TLS options, the pair checked now: one line naming what is wrong, not a traceback at start."""
    import ssl

    if not cert and not key:
        return {}
    if not (cert and key):
        raise UsageError("--tls-cert-file and --tls-key-file go together (DECODEBENCH_TLS_CERT_FILE, _KEY_FILE)")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        why = getattr(err, "strerror", None) or getattr(err, "reason", None) or "not a PEM certificate and key"
        raise UsageError(f"--tls-cert-file {cert} / --tls-key-file {key}: cannot load them ({why})") from None
    return {"ssl_certfile": cert, "ssl_keyfile": key}


@click.group()
def tokens() -> None:
    """Tokens of the submission server: make one, or hash one for the tokens file."""


@tokens.command("new")
@click.option("--id", "token_id", required=True, help="The token's name in audit lines (e.g. team-a-alice).")
@click.option("--tenant", "tenant", default=None, help="The tenant it acts as.")
@click.option("--admin", is_flag=True, help="May read every tenant's shares (status --all-tenants).")
def new(token_id: str, tenant: str | None, admin: bool) -> None:
    """Print a fresh token (give it to its user) and the entry for the tokens file (its sha256 only)."""
    import yaml

    from controller.server.tokens import TokenEntry, new_token

    token, digest = new_token()
    try:
        entry = TokenEntry(id=token_id, tenant=tenant, admin=admin, sha256=digest)
    except ValueError as err:
        raise UsageError(f"tokens new: {str(err).splitlines()[-1].strip()}") from None
    click.echo(f"token (shown once; store it in the user's DECODEBENCH_TOKEN_FILE): {token}", err=True)
    click.echo(yaml.safe_dump([entry.model_dump(exclude_defaults=True)], sort_keys=False), nl=False)


@tokens.command("hash")
def hash_token() -> None:
    """Read a token on standard input and print its sha256 (for the tokens file)."""
    import sys

    from controller.server.tokens import digest

    token = sys.stdin.readline().strip()
    if not token:
        raise UsageError("tokens hash: give the token on standard input")
    click.echo(digest(token))


COMMANDS = [serve, tokens]
