"""Reading a sweep spec: YAML or JSON to a validated `SweepSpec`, local paths resolved.

Every failure is one UsageError line: the file, the line where the tree tells it, the
field path, and what is wrong, e.g. `sweep.yaml:14: strategies[1]: params.p must be <= 1.0`.
Each kind of failure is caught where it arises (the file system, the YAML reader, the
models); anything else is a bug and shows as one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from controller.sweep import wording, yamlsafe
from controller.sweep.models import StrategyEntry, SweepSpec
from worker.core import settings
from worker.core.contract import ModelSpec
from worker.core.errors import UsageError, quote, short, shown
from worker.strategies import STRATEGIES

# A hub id: `name` or `org/name`, letters, digits, '-', '_' and '.' (as the hub allows).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


def dotted(loc: tuple[Any, ...]) -> str:
    """`("strategies", 1, "params", "p")` -> `strategies[1].params.p`, odd keys quoted."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            # an identifier as it is, unless long (a path of 1 MB keys made an 8 MB error line): shortened too
            text = part if isinstance(part, str) and part.isidentifier() and len(part) <= 40 else short(part, 40)
            out += f".{text}" if out else text
    return out


class Locator:
    """Prefixes messages with the spec file, the line of a field (from the YAML tree) and its path."""

    def __init__(self, source: str, root: Any = None) -> None:
        self.source, self.root = source, root

    def __call__(self, loc: tuple[Any, ...], message: str, note: str = "") -> str:
        line = yamlsafe.line_of(self.root, loc)
        where = f"{self.source}:{line}" if line else self.source
        return f"{where}: {dotted(loc)}{note}: {message}" if loc else f"{where}: {message}"


_SHOWN_LEVELS = 8  # of a path in a message: a refused nesting is 64 levels deep


def check_data(value: Any, source: str, level: int = 1) -> None:
    """Refuse, in one UsageError line naming the path, data that breaks what a sweep file may hold
    (`yamlsafe.data_fault`: nested too deep, text that is not valid Unicode): a request's body and a stored
    spec.json are held to the bounds a YAML file is, before they are validated."""
    fault = yamlsafe.data_fault(value, level)
    if fault is not None:
        loc, why = fault
        path = dotted(loc[:_SHOWN_LEVELS]) + ("..." if len(loc) > _SHOWN_LEVELS else "")
        raise UsageError(f"{source}: {path}: {why}" if path else f"{source}: {why}")


def _format_error(locate: Locator, err: ValidationError) -> str:
    # an unknown key first: a misspelt key is often why a required one is missing (`generaton:` beside no
    # `name:`), and its did-you-mean is the fix
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc = tuple(p for p in first["loc"] if not (p in ("str", "PromptItem") or "function-" in str(p)))
    said = wording.explain({**first, "loc": loc}, errors, SweepSpec)
    msg = said or first["msg"].removeprefix("Value error, ")
    loc = wording.member_free(loc)
    if first["type"] == "at":  # a rule that names the field it is about
        loc = (*loc, *first["ctx"]["loc"])
    more = len({wording.member_free(tuple(e["loc"])) for e in errors}) - 1  # a union's members: one error
    extra = f" (and {more} more)" if more > 0 else ""
    # A rule over several parameters names the strategy entry: `strategies[2] (diverse_beam): ...`
    note = f" ({first['ctx']['strategy']})" if first["type"] == "joint_rule" else ""
    return locate(loc, msg + extra, note)


def parse_spec(
    data: Any, source: str = "spec", base_dir: Path | None = None, check_paths: bool = True, root: Any = None
) -> SweepSpec:
    """Validate a spec dict; resolve relative local model and prompt paths against `base_dir`.

    With `check_paths=False` (submitting to workers that see other files), model paths
    that look local are made absolute but need not exist here. `root`, the YAML node tree
    the data came from, lets messages name the line.
    """
    locate = Locator(source, root)
    if not isinstance(data, dict):
        raise UsageError(locate((), f"the spec must be a mapping, got {type(data).__name__}"))
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise UsageError(_format_error(locate, err)) from None
    if base_dir is not None:
        spec = _resolve_paths(spec, base_dir, check_paths, locate)
        spec.base_dir = base_dir.resolve()
    return spec


def _why(err: OSError | ValueError | RuntimeError) -> str:
    return (err.strerror if isinstance(err, OSError) and err.strerror else str(err)).rstrip(".")


def _absolute(path: Path, label: str, shown_path: str) -> Path:
    """`path.resolve()`, or a UsageError for a symlink loop or an unreadable directory."""
    try:
        return path.resolve()
    except (OSError, ValueError, RuntimeError) as err:  # a NUL byte; RuntimeError: a symlink loop (3.11)
        raise UsageError(f"{label}: {shown_path} cannot be resolved ({_why(err)})") from None


def _local_path(base: Path, path: str, label: str) -> Path | None:
    """The local path `path` names (relative to the spec file), or None for a hub id."""
    try:
        local = Path(path).expanduser() if path.startswith("~") else base / path
    except RuntimeError:  # `~nosuchuser/...`: no home directory to expand
        raise UsageError(f"{label}: {quote(path)}: no such user's home directory") from None
    try:
        exists = local.exists()
    except (OSError, ValueError) as err:  # a name too long for the file system, a NUL byte
        raise UsageError(f"{label}: {quote(path)} is not a usable path ({_why(err)})") from None
    if exists or path.startswith((".", "/", "~")):
        return local
    if not _HUB_ID.fullmatch(path):
        raise UsageError(f"{label}: {quote(path)} is neither a local directory nor a hub id (org/name)")
    return None


def _model_dir(local: Path, path: str, label: str) -> None:
    """Refuse a local model path that is not a directory holding config.json."""
    try:
        if not local.exists():
            resolved = _absolute(local, label, quote(path))
            raise UsageError(
                f"{label}: local model path {quote(path)} does not exist (resolved to {shown(str(resolved))})"
            )
        if not local.is_dir():
            raise UsageError(
                f"{label}: local model path {quote(path)} is not a directory (a model directory holds config.json)"
            )
        if not (local / "config.json").is_file():
            raise UsageError(f"{label}: local model path {quote(path)} has no config.json: not a model directory")
    except OSError as err:  # permission denied on the way
        raise UsageError(f"{label}: local model path {quote(path)} cannot be read ({_why(err)})") from None


def _resolve_paths(spec: SweepSpec, base: Path, check_paths: bool, locate: Locator) -> SweepSpec:
    def resolve(path: str, loc: tuple[Any, ...]) -> str:
        """A local path (relative to the spec file) made absolute; a hub id left as it is."""
        label = locate(loc, "").removesuffix(": ")
        local = _local_path(base, path, label)
        if local is None:
            return path
        if check_paths:
            _model_dir(local, path, label)
        return str(_absolute(local, label, quote(path)))

    def resolve_model(m: ModelSpec | None, loc: tuple[Any, ...]) -> ModelSpec | None:
        if m is None:
            return None
        return m.model_copy(update={"path": resolve(m.path, (*loc, "path")), "name": m.label})

    def resolve_params(i: int, entry: StrategyEntry) -> StrategyEntry:
        params = dict(entry.params)
        for key, param in STRATEGIES.get(entry.name).all_params.items():
            if param.is_path and key in params:
                loc = ("strategies", i, "params", key)
                value = params[key]
                params[key] = [resolve(v, loc) for v in value] if isinstance(value, list) else resolve(value, loc)
        return entry.model_copy(update={"params": params})

    update: dict[str, Any] = {
        "models": [resolve_model(m, ("models", i)) for i, m in enumerate(spec.models)],
        "scorer": resolve_model(spec.scorer, ("scorer",)),
        "featurizer": resolve_model(spec.featurizer, ("featurizer",)),
        "strategies": [resolve_params(i, e) for i, e in enumerate(spec.strategies)],
    }
    if spec.judge is not None:
        judge: dict[str, Any] = {"local": resolve_model(spec.judge.local, ("judge", "local"))}
        for name in ("template", "api_key_file"):  # files the report reads, relative to the spec file
            if (value := getattr(spec.judge, name)) is not None:
                judge[name] = str(Path(value).expanduser() if value.startswith("~") else (base / value).resolve())
        update["judge"] = spec.judge.model_copy(update=judge)
    if spec.prompts.path is not None:
        update["prompts"] = spec.prompts.model_copy(update={"path": _prompt_file(spec.prompts.path, base, locate)})
    return spec.model_copy(update=update)


def _prompt_file(path: str, base: Path, locate: Locator) -> str:
    label = locate(("prompts", "path"), "").removesuffix(": ")
    try:
        p = Path(path).expanduser() if path.startswith("~") else base / path
        is_file = p.is_file()
    except RuntimeError:  # `~nosuchuser/...`
        raise UsageError(f"{label}: {quote(path)}: no such user's home directory") from None
    except (OSError, ValueError) as err:  # a name too long, a NUL byte
        raise UsageError(f"{label}: {quote(path)} is not a usable path ({_why(err)})") from None
    resolved = _absolute(p, label, quote(path))
    if not is_file:
        what = "does not exist" if not p.exists() else "is a directory, not a file" if p.is_dir() else "is not a file"
        raise UsageError(f"{label}: file {quote(path)} {what} (resolved to {shown(str(resolved))})")
    return str(resolved)


def inner_spec(stored: dict[str, Any] | None) -> dict[str, Any]:
    """The sweep spec itself from a stored spec.json, which wraps it with the sweep's metadata (an older one is the
    spec alone)."""
    inner = (stored or {}).get("spec")
    return inner if isinstance(inner, dict) else (stored or {})


def stored_spec(stored: dict, source: str) -> SweepSpec:
    """The spec as `save_sweep` wrote it to spec.json, with its directory, so it plans to the same ids."""
    spec = parse_spec(stored["spec"], source)
    if stored.get("base_dir"):
        spec.base_dir = Path(stored["base_dir"])
    return spec


def _read_text(path: Path, name: str) -> str:
    """The spec file's text: it must exist, be at most DECODEBENCH_SPEC_MAX_KB and be UTF-8."""
    limit_kb = settings.get("spec_max_kb")
    try:
        if not path.is_file():
            raise UsageError(f"{name}: no such spec file")
        if path.stat().st_size > limit_kb * 1024:
            raise UsageError(
                f"{name}: the spec file is {path.stat().st_size:,} bytes, over the limit of {limit_kb} KiB "
                f"(DECODEBENCH_SPEC_MAX_KB)"
            )
        data = path.read_bytes()
    except (OSError, ValueError) as err:  # a name too long, a NUL byte, permission denied
        raise UsageError(f"{name}: cannot read the spec file ({_why(err)})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{name}: not UTF-8 text (byte {err.start}); a sweep file must be UTF-8 YAML or JSON"
        ) from None


def _yaml_message(name: str, text: str, err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.reader.ReaderError):  # a character YAML does not allow
        line = text.count("\n", 0, err.position) + 1
        char = chr(err.character) if isinstance(err.character, int) else err.character
        return f"{name}:{line}: malformed YAML: character {char!r} is not allowed in YAML"
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f"{name}:{mark.line + 1}" if mark else name
    at = f" (column {mark.column + 1})" if mark else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
    if mark and "\t" in line[: mark.column + 1]:
        return f"{where}: a tab character (column {mark.column + 1}): YAML indents with spaces only; replace the tab"
    return f"{where}: malformed YAML{at}: {shown(problem, 160)}"


def load_spec(path: str | Path, check_paths: bool = True) -> SweepSpec:
    """Read a YAML or JSON spec file; every failure is one UsageError line."""
    path = Path(path)
    name = shown(str(path))
    text = _read_text(path, name)
    try:
        data, root = yamlsafe.load(text)
    except yaml.YAMLError as err:
        raise UsageError(_yaml_message(name, text, err)) from None
    return parse_spec(data, name, path.parent, check_paths, root)
