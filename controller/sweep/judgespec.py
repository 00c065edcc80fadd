"""The sweep spec's `judge:` section: who judges the answers, how, against which baseline, within which limits.

    judge:
      endpoint: team-judge          # a judge endpoint the operator declared in the tenants file
      # url: http://127.0.0.1:8000/v1   (local runs only: `decodebench run`)
      # local: {path: ../models/austen-tiny}   (a model decoded greedily by the own engine)
      model: Qwen2.5-7B-Instruct    # the `model` sent to the endpoint
      mode: pairwise                # or `single` (MT-Bench's 1-10 grading)
      baseline: greedy              # a strategy (per model) or a cell key
      criteria: [overall]
      limits: {concurrency: 4, max_requests: 2000, max_tokens: 400000, time_budget_s: 1800}

docs/judge.md explains the modes, the templates and what the verdicts are worth.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from worker.core.contract import ModelSpec

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # an endpoint's or criterion's name
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JudgeLimits(_Strict):
    """What a report may spend on the judge: checked before the first request is sent. Finite numbers only: an
    infinite time budget gave a deadline no judge job takes (`1e999` in YAML is infinity)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    concurrency: int = Field(default=4, strict=True, ge=1, le=256, description="Requests in flight at once.")
    max_requests: int = Field(
        default=2000,
        strict=True,
        ge=1,
        description="Requests a report may send (cached ones are free); more: refused before any.",
    )
    max_tokens: int = Field(
        default=2_000_000,
        strict=True,
        ge=1,
        description="Tokens (prompt + verdict, estimated at 4 characters a token before sending) a report may spend.",
    )
    time_budget_s: float = Field(
        default=3600.0, gt=0, description="Wall-clock seconds the judge may take; what is left then stays unjudged."
    )
    timeout_s: float = Field(default=120.0, gt=0, description="Seconds one request may take.")
    retries: int = Field(
        default=4, strict=True, ge=0, le=20, description="Retries of a request after a 429, a 5xx or a timeout."
    )


class JudgeSpec(_Strict):
    """An LLM judge: pairwise against a baseline variant (default) or single-answer 1-10 grading."""

    endpoint: str | None = Field(
        default=None,
        description="A judge endpoint declared by name in the tenants file (its URL and key are the operator's).",
    )
    url: str | None = Field(
        default=None,
        description="An OpenAI-compatible base URL (…/v1) called directly: local runs only (`decodebench run`).",
    )
    local: ModelSpec | None = Field(
        default=None, description="A model the report loads itself and decodes greedily with the own engine."
    )
    model: str | None = Field(
        default=None, description="The judge model's name sent in each request (endpoint/url); part of the cache key."
    )
    model_version: str = Field(
        default="", description="The judge model's version or date, recorded and part of the cache key."
    )
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the API key (url mode); never logged or written."
    )
    api_key_file: str | None = Field(
        default=None, description="File holding the API key (url mode); never logged or written."
    )
    mode: Literal["pairwise", "single"] = Field(
        default="pairwise", description="pairwise: each variant against the baseline, both orders; single: 1-10."
    )
    baseline: str | None = Field(
        default=None,
        description="The baseline variant: a strategy name (the first such cell of each model) or one cell key; "
        "default: each model's first cell.",
    )
    criteria: list[str] = Field(
        default_factory=lambda: ["overall"],
        min_length=1,
        description="What the judge is asked about, one request per criterion (lower-case names).",
    )
    template: str | None = Field(
        default=None,
        description="A user prompt template file (relative to the spec); default: the bundled versioned one.",
    )
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature of the judge.")
    max_new_tokens: int = Field(
        default=512, strict=True, ge=1, le=8192, description="Tokens the judge may write per verdict."
    )
    seed: int | None = Field(
        default=None, strict=True, description="Seed sent with each request where the endpoint honours it."
    )
    limits: JudgeLimits = Field(default_factory=JudgeLimits, description="Concurrency and budget.")

    @model_validator(mode="after")
    def _one_judge(self) -> JudgeSpec:
        given = [k for k in ("endpoint", "url", "local") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of `endpoint`, `url` or `local`")
        if self.local is None and not self.model:
            raise ValueError("model: the judge model's name is required for an endpoint or url")
        if self.local is not None and (self.temperature != 0 or self.seed is not None):
            raise ValueError("temperature/seed: a local judge decodes greedily (temperature 0, no seed)")
        if self.url is None and (self.api_key_env or self.api_key_file):
            raise ValueError("api_key_env/api_key_file: only with `url` (a declared endpoint's key is the operator's)")
        return self

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.fullmatch(v):
            raise ValueError("must be an endpoint name (lower-case letters, digits, '-'), not a URL")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", v):
            raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000/v1")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, v: str | None) -> str | None:
        if v is not None and not _ENV.fullmatch(v):
            raise ValueError("must name an environment variable (letters, digits, '_'), not hold a key")
        return v

    @field_validator("criteria")
    @classmethod
    def _criteria(cls, v: list[str]) -> list[str]:
        for c in v:
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", c):
                raise ValueError(f"{c[:40]!r}: a criterion is a lower-case name (letters, digits, '_')")
        if len(set(v)) != len(v):
            raise ValueError("criteria must be distinct")
        return v
