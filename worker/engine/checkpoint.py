"""A local checkpoint directory checked before transformers reads it, and its content hash.

What transformers would trip over (or read past) is named in one line, as a permanent job error
that names the model: a missing or oversized config, JSON that is not JSON, no weights, pickle
weights where safetensors are required, a damaged torch archive; after loading, weights that do
not fit the config and a tokenizer without a vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

from worker.core.contract import ModelSpec
from worker.core.errors import ModelUnavailableError, short, shown

_HASHED_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt")
# a chat template saved as its own file (chat_template.jinja: how recent transformers save one); not in the
# provenance's hash, which results recorded before it existed and a resumed sweep is checked against
_TEMPLATE_SUFFIXES = (".jinja",)


# a directory -> (its hashed files' names, inodes, sizes and modification times; their hash): its last hash
_HASHED: dict[str, tuple[tuple, str]] = {}


def content_hash(path: Path, *, templates: bool = False) -> str:
    """sha256 over the names and bytes of a local checkpoint's weight, config and tokenizer files (its chat template
    where tokenizer_config.json holds it); with `templates`, its .jinja chat template files too (a local judge's
    cache key, controller.judge.run).

    Kept per directory with the files' inodes, sizes and modification times: a second call on files unchanged since
    (local mode checks a resumed sweep's model before its jobs load it, controller.launch.local; a local judge's
    requests are keyed by it, controller.judge.run) reads no weights again; a file written since, or added or
    removed, is hashed afresh."""
    suffixes = _HASHED_SUFFIXES + (_TEMPLATE_SUFFIXES if templates else ())
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
    stamp = tuple(
        (f.relative_to(path).as_posix(), s.st_ino, s.st_size, s.st_mtime_ns) for f in files for s in [f.stat()]
    )
    key = f"{path.resolve()}{'+templates' if templates else ''}"
    if key in _HASHED and _HASHED[key][0] == stamp:
        return _HASHED[key][1]
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(path).as_posix().encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    _HASHED[key] = (stamp, h.hexdigest())
    return h.hexdigest()


_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json")
_JSON_MAX_BYTES = 16 * 2**20


def refused(spec: ModelSpec, what: str) -> ModelUnavailableError:
    """A model that cannot load on this worker: permanent, and it names the model (local mode then
    skips the model's other jobs with the same reason)."""
    return ModelUnavailableError(f"model {short(spec.label)} ({shown(spec.path)}): {what}", spec.path)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def check_local(spec: ModelSpec, local: Path) -> None:
    """What transformers would trip over (or read past) in a local model directory, named."""
    for name in _JSON_FILES:
        f = local / name
        if not f.is_file():
            if name == "config.json":
                raise refused(spec, "no config.json: not a model directory")
            continue
        if f.stat().st_size > _JSON_MAX_BYTES:
            raise refused(spec, f"{name} is larger than {_JSON_MAX_BYTES >> 20} MiB")
        try:
            data = json.loads(f.read_bytes())
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError both are
            raise refused(spec, f"{name} is not valid JSON ({first_line(err)})") from None
        if not isinstance(data, dict):
            raise refused(spec, f"{name} is not a JSON object")
    names = sorted(p.name for p in local.iterdir() if p.is_file())
    if not any(n.endswith(".safetensors") for n in names):
        pickles = [n for n in names if n.endswith(_PICKLE_SUFFIXES)]
        if not pickles:
            raise refused(spec, "no weights file (*.safetensors) in it")
        if spec.use_safetensors:
            raise refused(
                spec,
                f"weights only in pickle form ({', '.join(pickles[:3])}); convert them to safetensors, "
                "or set use_safetensors: false on the model for a checkpoint you trust",
            )
        for name in pickles:
            problem = _torch_archive_problem(local / name)
            if problem:
                raise refused(spec, f"{name} is not a readable torch checkpoint: {problem}")


def _torch_archive_problem(path: Path) -> str | None:
    """Why a pickle weights file cannot be a torch checkpoint (None: it may be one).

    torch.save writes a zip archive (checked member by member against its CRCs, so a
    truncated or altered file is named here rather than failing inside torch.load with an
    error that cannot be told from a device error); the legacy format is a bare pickle
    (protocol 2 or later, first byte 0x80).
    """
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            return f"a damaged zip archive ({first_line(err)})"
        return f"a damaged zip archive (member {bad} fails its CRC)" if bad else None
    with path.open("rb") as f:
        head = f.read(4)
    if head.startswith(b"\x80"):
        return None
    if head.startswith(b"PK"):
        return "an incomplete zip archive (truncated?)"
    return "neither a zip archive (torch.save) nor a pickle (empty or another format?)"


def check_fit(spec: ModelSpec, model, info: dict, tokenizer) -> None:
    """Weights that do not match the config (another architecture, other shapes), which
    transformers would fill with random values, and a tokenizer with no vocabulary."""
    missing, mismatched = list(info.get("missing_keys") or []), list(info.get("mismatched_keys") or [])
    if missing or mismatched:
        example = missing[0] if missing else mismatched[0][0]
        raise refused(
            spec,
            f"its weights do not fit its config ({type(model).__name__}, model_type {model.config.model_type!r}): "
            f"{len(missing)} weights missing, {len(mismatched)} of another shape (e.g. {short(example)})",
        )
    if len(tokenizer) < 2:
        raise refused(spec, f"its tokenizer has {len(tokenizer)} token(s): no tokenizer or vocabulary files?")
