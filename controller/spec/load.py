"""Reading a sweep spec: YAML or JSON to a validated `SweepSpec`, local paths resolved.

Every failure is one UsageError line naming the file and the field path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from controller.spec.models import StrategyEntry, SweepSpec
from worker.core.contract import ModelSpec
from worker.core.errors import UsageError
from worker.strategies import STRATEGIES


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
        spec.base_dir = base_dir.resolve()
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
        spec.base_dir = Path(stored["base_dir"])
    return spec


def load_spec(path: str | Path, check_paths: bool = True) -> SweepSpec:
    """Read a YAML or JSON spec file; every failure is one UsageError line."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such spec file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{path}: not UTF-8 text (byte {err.start}); a sweep file must be UTF-8 YAML or JSON"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UsageError(f"{path}: malformed YAML{where}: {problem}") from None
    return parse_spec(data, str(path), path.parent, check_paths)
