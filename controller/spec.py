"""The sweep spec: pydantic v2 models loaded from YAML or JSON.

The JSON schema (`decodebench validate --schema`) is generated from these models.
Every error names its field path, e.g. `strategies[1].params.p: must be <= 1.0`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from worker.contract import GenerationSettings, ModelSpec, PromptItem
from worker.errors import UsageError
from worker.metrics import METRICS
from worker.strategies import STRATEGIES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptSet(_Strict):
    """Where the prompts come from: a JSONL/CSV file or an inline list."""

    path: str | None = Field(default=None, description="JSONL or CSV file (relative to the spec file) with fields `prompt`, optional `reference` and `id`.")
    inline: list[str | PromptItem] | None = Field(default=None, description="Prompts written in the spec: strings or {id, prompt, reference} objects.")
    limit: int | None = Field(default=None, ge=1, description="Use only the first N prompts.")
    shard_size: int = Field(default=32, ge=1, description="Prompts per job: a cell's prompts are split into shards of this size.")

    @model_validator(mode="after")
    def _one_source(self) -> "PromptSet":
        if (self.path is None) == (self.inline is None):
            raise ValueError("give exactly one of `path` or `inline`")
        return self


class StrategyEntry(_Strict):
    """A strategy and its parameters; a list-valued parameter expands to a grid."""

    name: str = Field(description="A registered strategy (see `decodebench strategies`).")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameter values; a list gives one variant per value (grid over all lists).")

    @model_validator(mode="after")
    def _check(self) -> "StrategyEntry":
        if self.name not in STRATEGIES:
            raise ValueError(STRATEGIES.unknown_message(self.name))
        strategy = STRATEGIES.get(self.name)
        for key, value in self.params.items():
            if key not in strategy.all_params:
                raise ValueError(
                    f"params.{key}: unknown parameter for {self.name!r}; valid: {', '.join(sorted(strategy.all_params))}"
                )
            values = value if isinstance(value, list) else [value]
            if not values:
                raise ValueError(f"params.{key}: an empty list gives no variant")
            for v in values:
                try:
                    strategy.all_params[key].check(key, v)
                except ValueError as err:
                    raise ValueError(f"params.{err}") from None
        for key, param in strategy.all_params.items():
            if param.default is None and not param.optional and key not in self.params:
                raise ValueError(f"params.{key} is required for strategy {self.name!r}")
        return self


class Generation(GenerationSettings):
    """Generation settings shared by all strategies, plus the seeds."""

    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="Seeds; stochastic strategies run once per seed, deterministic ones once.")

    @model_validator(mode="after")
    def _min_le_max(self) -> "Generation":
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens must not exceed max_new_tokens")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        return self

    def settings(self) -> GenerationSettings:
        return GenerationSettings(**self.model_dump(exclude={"seeds"}))


class SweepSpec(_Strict):
    """A sweep: strategies x models x a prompt set."""

    name: str = Field(min_length=1, description="Human name of the sweep.")
    description: str = Field(default="", description="Free text kept with the sweep.")
    models: list[ModelSpec] = Field(min_length=1, description="Models to compare.")
    prompts: PromptSet = Field(description="The prompt set.")
    strategies: list[StrategyEntry] = Field(min_length=1, description="Strategies to compare.")
    generation: Generation = Field(default_factory=Generation, description="Shared generation settings.")
    metrics: list[str] | None = Field(default=None, description="Quality metrics to compute; default: all that apply.")
    scorer: ModelSpec | None = Field(default=None, description="Model that scores perplexity for every cell; default: each cell's own model.")
    job_timeout_s: int = Field(default=3600, ge=1, description="Wall-clock limit of one job on a worker.")
    # The spec file's directory: local paths enter the sweep id relative to it, so the same
    # sweep checked out in two places has one id.
    _base_dir: Path | None = PrivateAttr(default=None)

    def portable_path(self, path: str) -> str:
        """`path` relative to the spec file's directory if it is a resolved local path."""
        if self._base_dir is not None and Path(path).is_absolute():
            return os.path.relpath(path, self._base_dir)
        return path

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            if name not in METRICS:
                raise ValueError(METRICS.unknown_message(name))
        return v

    @model_validator(mode="after")
    def _unique_model_labels(self) -> "SweepSpec":
        labels = [m.label for m in self.models]
        dup = {x for x in labels if labels.count(x) > 1}
        if dup:
            raise ValueError(f"models: two models share the label {sorted(dup)[0]!r}; give them distinct `name`s")
        return self


def _format_error(source: str, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ""
    for part in first["loc"]:
        if isinstance(part, int):
            loc += f"[{part}]"
        elif part in ("str", "PromptItem") or "function-" in str(part):
            continue
        else:
            loc += f".{part}" if loc else str(part)
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    extra = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: {loc or 'spec'}: {msg}{extra}"


def parse_spec(data: Any, source: str = "spec", base_dir: Path | None = None, check_paths: bool = True) -> SweepSpec:
    """Validate a spec dict; resolve relative local model and prompt paths against `base_dir`.

    With `check_paths=False` (submitting to workers that see other files), model paths
    that look local are made absolute but need not exist here.
    """
    if not isinstance(data, dict):
        raise UsageError(f"{source}: the spec must be a mapping, got {type(data).__name__}")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise UsageError(_format_error(source, err)) from None
    if base_dir is not None:
        spec = _resolve_paths(spec, base_dir, check_paths)
        spec._base_dir = base_dir.resolve()
    return spec


def _resolve_paths(spec: SweepSpec, base: Path, check_paths: bool = True) -> SweepSpec:
    def resolve(path: str, where: str) -> str:
        """A local path (relative to the spec file) made absolute; a hub id left as it is."""
        local = (base / path).expanduser()
        if path.startswith((".", "/", "~")) or local.exists():
            if check_paths and not local.exists():
                raise UsageError(f"{where}: local model path {path!r} does not exist (resolved to {local.resolve()})")
            return str(local.resolve())
        return path

    def resolve_model(m: ModelSpec | None, where: str) -> ModelSpec | None:
        return None if m is None else m.model_copy(update={"path": resolve(m.path, where), "name": m.label})

    def resolve_params(i: int, entry: StrategyEntry) -> StrategyEntry:
        params = dict(entry.params)
        for key, param in STRATEGIES.get(entry.name).all_params.items():
            if param.is_path and key in params:
                where = f"strategies[{i}].params.{key}"
                value = params[key]
                params[key] = [resolve(v, where) for v in value] if isinstance(value, list) else resolve(value, where)
        return entry.model_copy(update={"params": params})

    update: dict[str, Any] = {
        "models": [resolve_model(m, f"models[{i}]") for i, m in enumerate(spec.models)],
        "scorer": resolve_model(spec.scorer, "scorer"),
        "strategies": [resolve_params(i, e) for i, e in enumerate(spec.strategies)],
    }
    if spec.prompts.path is not None:
        p = (base / spec.prompts.path).expanduser()
        if not p.is_file():
            raise UsageError(f"prompts.path: file {spec.prompts.path!r} does not exist (resolved to {p.resolve()})")
        update["prompts"] = spec.prompts.model_copy(update={"path": str(p.resolve())})
    return spec.model_copy(update=update)


def stored_spec(stored: dict, source: str) -> SweepSpec:
    """The spec as `save_sweep` wrote it to spec.json, with its directory, so it plans to the same ids."""
    spec = parse_spec(stored["spec"], source)
    if stored.get("base_dir"):
        spec._base_dir = Path(stored["base_dir"])
    return spec


def load_spec(path: str | Path, check_paths: bool = True) -> SweepSpec:
    """Read a YAML or JSON spec file; every failure is one UsageError line."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such spec file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UsageError(f"{path}: malformed YAML{where}: {problem}") from None
    return parse_spec(data, str(path), path.parent, check_paths)


def load_prompts(prompts: PromptSet) -> list[PromptItem]:
    """The prompt set's items, in file order, with stable ids, cut to `limit`."""
    raw: list[Any]
    if prompts.inline is not None:
        raw = list(prompts.inline)
        where = "prompts.inline"
    else:
        path = Path(prompts.path)
        where = f"prompts.path ({path.name})"
        if path.suffix.lower() == ".csv":
            with path.open(newline="") as f:
                raw = list(csv.DictReader(f))
        else:
            raw = []
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if line.strip():
                    try:
                        raw.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise UsageError(f"{where}: line {n} is not valid JSON: {err.msg}") from None
    items = []
    for i, entry in enumerate(raw):
        if isinstance(entry, str):
            entry = {"prompt": entry}
        if isinstance(entry, PromptItem):
            items.append(entry)
            continue
        if not isinstance(entry, dict) or not str(entry.get("prompt") or "").strip():
            raise UsageError(f"{where}: item {i} has no `prompt`")
        extra = set(entry) - {"id", "prompt", "reference"}
        if extra:
            raise UsageError(f"{where}: item {i} has unknown field {sorted(extra)[0]!r} (valid: id, prompt, reference)")
        items.append(PromptItem(id=str(entry.get("id") or f"p{i:05d}"), prompt=entry["prompt"], reference=entry.get("reference") or None))
    ids = [p.id for p in items]
    if len(set(ids)) != len(ids):
        raise UsageError(f"{where}: prompt ids are not unique")
    if not items:
        raise UsageError(f"{where}: the prompt set is empty")
    return items[: prompts.limit] if prompts.limit else items


def spec_hash(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj`."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def json_schema() -> dict:
    return SweepSpec.model_json_schema()
