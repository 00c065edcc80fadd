"""The submission server's tokens file: who may call it, as which tenant.

    tokens:
      - id: team-a-ci            # names the token in audit lines (not secret)
        tenant: team-a
        sha256: 3f7c...           # sha256 (hex) of the token; the token itself is never stored
      - id: ops
        admin: true              # may read every tenant's shares (status --all-tenants)
        sha256: 9a01...

A tenant may hold several tokens at once (one per user, or the old and the new one while a
token is rotated). The server re-reads the file when it changes (a Kubernetes Secret volume
is updated in place), so adding or removing a token needs no restart. A presented token is
hashed and looked up: the comparison never runs over the secret itself.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from worker.core.errors import UsageError
from worker.core.settings import DEFAULT_TENANT, check_tenant
from worker.core.tenants import RESERVED, TenantsFile, one_line

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_SHA = re.compile(r"[0-9a-f]{64}")
TOKEN_BYTES = 32  # 256 bits of entropy


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Names the token in audit lines; letters, digits, '.', '_', '-'.")
    tenant: str | None = Field(default=None, description="The tenant the token acts as.")
    admin: bool = Field(default=False, description="May read every tenant's shares.")
    sha256: str = Field(description="sha256 (hex) of the token.")

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.fullmatch(value):
            raise ValueError("must be 1-63 letters, digits, '.', '_' or '-'")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha(cls, value: str) -> str:
        if not _SHA.fullmatch(value):
            raise ValueError("must be the 64 lower-case hex digits of the token's sha256, not the token")
        return value

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str | None) -> str | None:
        return None if value is None else check_tenant(value)

    @model_validator(mode="after")
    def _acts_as_someone(self) -> TokenEntry:
        if self.tenant is None and not self.admin:
            raise ValueError("give the token a tenant, or admin: true")
        return self


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: list[TokenEntry] = Field(min_length=1, description="Every token the server accepts.")

    @model_validator(mode="after")
    def _unique(self) -> TokensFile:
        ids, hashes = set(), set()
        for i, t in enumerate(self.tokens):
            if t.id in ids:
                raise ValueError(f"tokens[{i}].id: duplicate token id {t.id!r}")
            if t.sha256 in hashes:
                raise ValueError(f"tokens[{i}].sha256: the same token is listed twice")
            ids.add(t.id)
            hashes.add(t.sha256)
        return self


@dataclass(frozen=True)
class Identity:
    """Who made a request: the token's id, its tenant (None for an admin-only token), admin or not."""

    token_id: str
    tenant: str | None
    admin: bool


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(token, its sha256): a fresh random token for `decodebench tokens new`."""
    token = "dbt_" + secrets.token_urlsafe(TOKEN_BYTES)
    return token, digest(token)


def parse_tokens(data, source: str, tenants: TenantsFile | None) -> TokensFile:
    """A validated tokens file whose tenants are declared (or `default` without a tenants file)."""
    try:
        parsed = TokensFile.model_validate(data)
    except ValidationError as err:
        raise one_line(err, source, "unknown key (a token is stored as its sha256, never in clear)") from None
    for i, t in enumerate(parsed.tokens):
        if t.tenant is None:
            continue
        known = tenants.get(t.tenant) is not None if tenants else t.tenant == DEFAULT_TENANT
        if not known:
            have = ", ".join(x.name for x in tenants.tenants) if tenants else DEFAULT_TENANT
            raise UsageError(f"{source}: tokens[{i}].tenant: {t.tenant!r} is not a tenant of the deployment ({have})")
        if tenants and t.tenant in RESERVED:
            raise UsageError(f"{source}: tokens[{i}].tenant: {t.tenant!r} is reserved")
    return parsed


class TokenStore:
    """The tokens file, re-read when its content changes (its sha256, checked at most once a second: an edit
    that keeps the size and the modification time, as `cp -p` and `rsync -t` make, still takes effect)."""

    MAX_BYTES = 4 * 2**20  # a tokens file is a few KiB; a larger one is refused, not read

    def __init__(self, path: str | Path, tenants: TenantsFile | None) -> None:
        self.path, self.tenants = Path(path), tenants
        self._lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self._stamp: str | None = None
        self._by_hash: dict[str, Identity] = {}
        self._checked = 0.0
        self.reload(force=True)

    def _bytes(self) -> bytes:
        try:
            with self.path.open("rb") as f:
                data = f.read(self.MAX_BYTES + 1)
        except OSError as err:
            raise UsageError(f"{self.path}: cannot read the tokens file: {err.strerror}") from None
        if len(data) > self.MAX_BYTES:
            raise UsageError(f"{self.path}: the tokens file is over {self.MAX_BYTES // 2**20} MiB; not read")
        return data

    def _parse(self, data: bytes) -> TokensFile:
        import yaml

        try:
            parsed = yaml.safe_load(data.decode())
        except UnicodeDecodeError as err:
            raise UsageError(f"{self.path}: not UTF-8 (byte {err.start})") from None
        except yaml.YAMLError as err:
            raise UsageError(f"{self.path}: not valid YAML: {str(err).splitlines()[0]}") from None
        return parse_tokens(parsed, str(self.path), self.tenants)

    def reload(self, force: bool = False) -> None:
        """Re-read the file if its content changed. A file that became invalid keeps the last good tokens
        (a half-written Secret must not lock everybody out); the error is raised to be logged."""
        data = self._bytes()
        stamp = hashlib.sha256(data).hexdigest()
        if not force and stamp == self._stamp:
            return
        parsed = self._parse(data)
        by_hash = {t.sha256: Identity(t.id, t.tenant, t.admin) for t in parsed.tokens}
        with self._lock:
            self._by_hash, self._stamp = by_hash, stamp

    def identify(self, token: str, now: float) -> Identity | None:
        with self._reload_lock:  # requests arriving while the file is re-read wait for the new tokens
            if now - self._checked >= 1.0:
                self._checked = now
                try:
                    self.reload()
                except (OSError, UsageError) as err:
                    import structlog

                    structlog.get_logger("decodebench.server").warning("tokens.reload_failed", error=str(err))
        with self._lock:
            return self._by_hash.get(digest(token))
