"""The tenants file: the teams of a shared deployment, declared once.

    tenants:
      - name: team-a
        weight: 3                      # share of worker time against the other tenants
        max_running: 4                 # jobs running at once, across all workers
        models: [/models/austen-tiny, gpt2@e7da7f2]  # optional: the only models (path[@revision]) its jobs may load
        trust_remote_code: false       # may its jobs run a checkpoint's own code
        quota: {queued_jobs: 20000, queued_mb: 512, sweeps_in_flight: 20, queued_report_cells: 5000, held_jobs: 100000}
        rate_limit: 600                # requests a minute per token at the submission server
        secrets: {s3: team-a-s3}       # its S3 keys (reports read results with them)
        judges: [big-judge]            # judge endpoints (below) its sweeps may name; unset: none
    judges:                            # LLM judge endpoints, declared by the operator only (docs/judge.md)
      - {name: big-judge, url: "http://vllm-judge:8000/v1", api_key_file: /secrets/judge/key, secret: judge-key}
    server: {redis_password_env: SERVER_REDIS_PASSWORD, secret: decodebench-server-redis}
    worker: {redis_password_env: WORKER_REDIS_PASSWORD, secret: decodebench-worker-redis}
    keda: {redis_password_env: KEDA_REDIS_PASSWORD, secret: decodebench-keda-redis}
    exporter: {redis_password_env: EXPORTER_REDIS_PASSWORD, secret: decodebench-exporter-redis}

Tenants hold no Redis credentials: the submission server is their only door. Only the
deployment's own services (server, worker, keda, exporter) have Redis users.

Credentials are referenced (an environment variable name, a Kubernetes Secret name), never
written inline: an unknown key such as `password:` is refused like any other. A bad file is
one line naming the field (UsageError, exit 2). The worker reads weights, quotas and allowed
models from it (DECODEBENCH_TENANTS_FILE); the submission server its quotas, rate limit and
policy; `decodebench tenants acl` renders Redis users.

A tenant's name is its store prefix and queue name: 1-63 letters, digits, '.', '_', '-', the
whole string (no trailing newline), and none of the names of the deployment's own Redis users.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from worker.core.errors import UsageError
from worker.core.settings import check_tenant

_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The deployment's own Redis users (and Redis's `default`): never a tenant's name.
RESERVED = ("default", "server", "worker", "keda", "exporter")
_SECRET = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a Kubernetes object name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _env_name(value: str | None) -> str | None:
    if value is not None and not _ENV.fullmatch(value):
        raise ValueError("must name an environment variable (letters, digits, '_'), not hold a password")
    return value


def _secret_name(value: str | None) -> str | None:
    if value is not None and not _SECRET.fullmatch(value):
        raise ValueError("must be a Kubernetes Secret name (lower-case letters, digits, '-', '.')")
    return value


NO_REDIS = "tenants hold no Redis credentials (the submission server is their only door); remove it"


class Secrets(_Strict):
    redis: str | None = Field(default=None, description="Refused: tenants hold no Redis credentials.")
    s3: str | None = Field(default=None, description="Secret holding the tenant's S3 access key and secret key.")

    _names = field_validator("s3")(classmethod(lambda cls, v: _secret_name(v)))

    @field_validator("redis")
    @classmethod
    def _no_redis(cls, value: str | None) -> None:
        if value is not None:
            raise ValueError(NO_REDIS)


class Quota(_Strict):
    """What a tenant may hold in the shared Redis at once, checked by the submission server at submit."""

    queued_jobs: int = Field(default=100_000, ge=1, description="Jobs queued (not yet started) at once.")
    queued_mb: float = Field(default=1024.0, gt=0, description="MiB of queued job payloads (prompts included) at once.")
    sweeps_in_flight: int = Field(default=50, ge=1, description="Sweeps with jobs still queued or running.")
    queued_report_cells: int = Field(
        default=20_000, ge=1, description="Report cells (`report --distributed` map jobs) queued at once."
    )
    held_jobs: int = Field(
        default=500_000,
        ge=1,
        description="Jobs whose state Redis keeps for it at once, in any state (its submitted sweeps'); a submit "
        "past it first forgets the tenant's oldest sweeps with nothing queued or running (their results, logs and "
        "specs stay in the store).",
    )

    @property
    def queued_bytes(self) -> int:
        return int(self.queued_mb * 1024 * 1024)


class Tenant(_Strict):
    name: str = Field(description="Tenant name: queues decodebench.<name>.*, keys decodebench:<name>:*, store <name>/.")
    weight: float = Field(default=1.0, gt=0, description="Share of worker time relative to the other tenants.")
    max_running: int | None = Field(default=None, ge=1, description="Jobs running at once across all workers.")
    models: list[str] | None = Field(
        default=None,
        description="Models its jobs may load as model, scorer, assistant or featurizer: a path or hub id (any "
        "revision) or `path@revision` (that revision only). Unset: any.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Whether its jobs may load a model with trust_remote_code (a checkpoint's code)."
    )
    quota: Quota = Field(default_factory=Quota, description="Queued jobs, payload bytes and sweeps it may hold.")
    rate_limit: int = Field(default=600, ge=1, description="Requests a minute per token at the submission server.")
    redis_password_env: str | None = Field(default=None, description="Refused: tenants hold no Redis credentials.")
    secrets: Secrets = Field(default_factory=Secrets, description="Kubernetes Secrets of its credentials.")
    judges: list[str] = Field(
        default_factory=list, description="Judge endpoints (declared under `judges`) its sweeps may name."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if "/" in value:
            raise ValueError("must not contain '/' (it names a store prefix)")
        if value in RESERVED:
            raise ValueError(f"{value!r} is reserved (the names {', '.join(RESERVED)} are the deployment's own)")
        return check_tenant(value)

    def allows_model(self, path: str, revision: str | None) -> bool:
        """Whether `path` at `revision` is among its models (`path` or `path@revision`; unset: any)."""
        if self.models is None:
            return True
        return path in self.models or (revision is not None and f"{path}@{revision}" in self.models)

    @field_validator("redis_password_env")
    @classmethod
    def _no_redis(cls, value: str | None) -> None:
        if value is not None:
            raise ValueError(NO_REDIS)


class JudgeEndpoint(_Strict):
    """An OpenAI-compatible judge endpoint: a network address the report calls, so only the operator names it."""

    name: str = Field(description="The name sweeps use (`judge.endpoint`): lower-case letters, digits, '-'.")
    url: str = Field(description="Its base URL (…/v1).")
    api_key_env: str | None = Field(default=None, description="Environment variable holding its API key.")
    api_key_file: str | None = Field(default=None, description="File holding its API key (a mounted Secret).")
    secret: str | None = Field(default=None, description="Kubernetes Secret holding the key (mounted as the file).")

    _env = field_validator("api_key_env")(classmethod(lambda cls, v: _env_name(v)))
    _secret = field_validator("secret")(classmethod(lambda cls, v: _secret_name(v)))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
            raise ValueError("must be lower-case letters, digits and '-' (at most 63)")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
            raise ValueError("must be an http(s) URL")
        return value


class Service(_Strict):
    redis_password_env: str | None = Field(default=None, description="Environment variable holding its Redis password.")
    secret: str | None = Field(default=None, description="Kubernetes Secret holding that password (key `password`).")

    _env = field_validator("redis_password_env")(classmethod(lambda cls, v: _env_name(v)))
    _secret = field_validator("secret")(classmethod(lambda cls, v: _secret_name(v)))


class TenantsFile(_Strict):
    tenants: list[Tenant] = Field(min_length=1, description="The tenants of the deployment.")
    judges: list[JudgeEndpoint] = Field(
        default_factory=list, description="LLM judge endpoints tenants may be allowed to name (docs/judge.md)."
    )
    server: Service = Field(
        default_factory=Service, description="The submission server's Redis user (writes every tenant's sweeps)."
    )
    worker: Service = Field(default_factory=Service, description="The workers' Redis user (serves every tenant).")
    keda: Service = Field(
        default_factory=Service, description="KEDA's Redis user: its scaler's script counting queued and running jobs."
    )
    exporter: Service = Field(
        default_factory=Service, description="redis_exporter's Redis user (INFO, CONFIG GET, SLOWLOG, ...; no keys)."
    )

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        seen: set[str] = set()
        for i, t in enumerate(self.tenants):
            if t.name in seen:
                raise ValueError(f"tenants[{i}].name: duplicate tenant name {t.name!r}")
            seen.add(t.name)
        declared = [j.name for j in self.judges]
        if len(set(declared)) != len(declared):
            raise ValueError("judges: two judge endpoints share a name")
        for i, t in enumerate(self.tenants):
            unknown = [n for n in t.judges if n not in declared]
            if unknown:
                raise ValueError(f"tenants[{i}].judges: {unknown[0]!r} is not a declared judge endpoint")
        return self

    def judge(self, name: str) -> JudgeEndpoint | None:
        return next((j for j in self.judges if j.name == name), None)

    def get(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants if t.name == name), None)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def one_line(err: ValidationError, source: str, unknown_key: str) -> UsageError:
    """The first error of a file's validation as one line naming the field; `unknown_key` says what
    an unknown key means in that file."""
    first = err.errors()[0]
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = unknown_key
    where = _loc(first["loc"])
    return UsageError(f"{source}: {where + ': ' if where else ''}{msg}")


def parse_tenants(data, source: str = "tenants file") -> TenantsFile:
    """A validated TenantsFile; UsageError with one line naming the field otherwise."""
    try:
        return TenantsFile.model_validate(data)
    except ValidationError as err:
        unknown = "unknown key (credentials are referenced: redis_password_env, secret, secrets.s3)"
        raise one_line(err, source, unknown) from None


def load_tenants(path: str | Path) -> TenantsFile:
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise UsageError(f"{p}: cannot read the tenants file: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UsageError(f"{p}: not valid YAML: {str(err).splitlines()[0]}") from None
    return parse_tenants(data, str(p))
