"""Loading models and tokenizers, and an LRU cache of loaded models per worker.

A worker process keeps its loaded models across jobs (RQ runs jobs in-process),
bounded by a count and a parameter-memory budget.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from worker.core import settings
from worker.core.contract import ModelSpec
from worker.core.errors import ModelUnavailableError, short, shown
from worker.core.hub import unavailable_reason

log = structlog.get_logger("decodebench.models")

_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}
_HASHED_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".txt")


@dataclass
class LoadedModel:
    spec: ModelSpec
    model: Any
    tokenizer: Any
    device: Any
    info: dict[str, Any]
    warmed: bool = False
    nbytes: int = 0
    uses: int = field(default=0)


def quiet_transformers() -> None:
    """transformers' own progress bars and warnings would interleave with decodebench's output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def content_hash(path: Path) -> str:
    """sha256 over the names and bytes of a local checkpoint's weight, config and tokenizer files."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _HASHED_SUFFIXES):
        h.update(f.relative_to(path).as_posix().encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json")
_JSON_MAX_BYTES = 16 * 2**20


def _refused(spec: ModelSpec, what: str) -> ModelUnavailableError:
    return ModelUnavailableError(f"model {short(spec.label)} ({shown(spec.path)}): {what}", spec.path)


def _first(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _check_local(spec: ModelSpec, local: Path) -> None:
    """What transformers would trip over (or read past) in a local model directory, named."""
    for name in _JSON_FILES:
        f = local / name
        if not f.is_file():
            if name == "config.json":
                raise _refused(spec, "no config.json: not a model directory")
            continue
        if f.stat().st_size > _JSON_MAX_BYTES:
            raise _refused(spec, f"{name} is larger than {_JSON_MAX_BYTES >> 20} MiB")
        try:
            data = json.loads(f.read_bytes())
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError both are
            raise _refused(spec, f"{name} is not valid JSON ({_first(err)})") from None
        if not isinstance(data, dict):
            raise _refused(spec, f"{name} is not a JSON object")
    names = sorted(p.name for p in local.iterdir() if p.is_file())
    if not any(n.endswith(".safetensors") for n in names):
        pickles = [n for n in names if n.endswith(_PICKLE_SUFFIXES)]
        if not pickles:
            raise _refused(spec, "no weights file (*.safetensors) in it")
        if spec.use_safetensors:
            raise _refused(
                spec,
                f"weights only in pickle form ({', '.join(pickles[:3])}); convert them to safetensors, "
                "or set use_safetensors: false on the model for a checkpoint you trust",
            )
        for name in pickles:
            problem = _torch_archive_problem(local / name)
            if problem:
                raise _refused(spec, f"{name} is not a readable torch checkpoint: {problem}")


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
            return f"a damaged zip archive ({_first(err)})"
        return f"a damaged zip archive (member {bad} fails its CRC)" if bad else None
    with path.open("rb") as f:
        head = f.read(4)
    if head.startswith(b"\x80"):
        return None
    if head.startswith(b"PK"):
        return "an incomplete zip archive (truncated?)"
    return "neither a zip archive (torch.save) nor a pickle (empty or another format?)"


def _check_fit(spec: ModelSpec, model, info: dict, tokenizer) -> None:
    """Weights that do not match the config (another architecture, other shapes), which
    transformers would fill with random values, and a tokenizer with no vocabulary."""
    missing, mismatched = list(info.get("missing_keys") or []), list(info.get("mismatched_keys") or [])
    if missing or mismatched:
        example = missing[0] if missing else mismatched[0][0]
        raise _refused(
            spec,
            f"its weights do not fit its config ({type(model).__name__}, model_type {model.config.model_type!r}): "
            f"{len(missing)} weights missing, {len(mismatched)} of another shape (e.g. {short(example)})",
        )
    if len(tokenizer) < 2:
        raise _refused(spec, f"its tokenizer has {len(tokenizer)} token(s): no tokenizer or vocabulary files?")


def _load_tokenizer(spec: ModelSpec, kwargs: dict[str, Any]):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(spec.path, **kwargs)
    # a tokenizer.json of the wrong shape surfaces as whichever lookup failed on it
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        hub = unavailable_reason(err)  # the hub, not the tokenizer, is what failed: say so, with the fix
        raise _refused(spec, hub or f"its tokenizer cannot load: {type(err).__name__}: {_first(err)}") from None


def load(spec: ModelSpec, device) -> LoadedModel:
    """Load tokenizer and model with the Auto classes; a model that cannot load, or a directory
    that is not a model, is a permanent job error with one reason line naming the model."""
    import torch
    import transformers
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    local = Path(spec.path)
    is_local = local.is_dir()
    if spec.path.startswith(("/", ".")) and not is_local:
        raise _refused(spec, "the local path does not exist on this worker")
    if is_local:
        _check_local(spec, local)
    kwargs: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code}
    if spec.revision and not is_local:
        kwargs["revision"] = spec.revision
    tokenizer = _load_tokenizer(spec, kwargs)
    dtype = getattr(torch, _DTYPES[spec.dtype]) if spec.dtype != "auto" else "auto"
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            spec.path,
            dtype=dtype,
            use_safetensors=spec.use_safetensors,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported below, in one line, rather than raised
            **kwargs,
        )
        attention = spec.attention if spec.attention == "eager" or model._supports_sdpa else "eager"
        model.set_attn_implementation(attention)
    except SafetensorError as err:
        raise _refused(spec, f"its safetensors weights cannot be read (empty or truncated?): {_first(err)}") from None
    except (OSError, ValueError) as err:
        raise _refused(spec, unavailable_reason(err) or f"cannot load: {_first(err)}") from None
    _check_fit(spec, model, loading, tokenizer)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    n_params = sum(p.numel() for p in model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    info = {
        "path": spec.path,
        "label": spec.label,
        "revision": spec.revision if not is_local else None,
        "commit": getattr(model.config, "_commit_hash", None),
        "content_hash": content_hash(local) if is_local else None,
        "n_params": n_params,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "architecture": (model.config.architectures or [type(model).__name__])[0],
        "attention": model.config._attn_implementation,
        "load_s": round(time.perf_counter() - start, 3),
        "transformers": transformers.__version__,
    }
    log.info("model.loaded", model=spec.label, params=n_params, dtype=info["dtype"], load_s=info["load_s"])
    return LoadedModel(spec, model, tokenizer, device, info, nbytes=nbytes)


class ModelCache:
    """LRU of loaded models, bounded by `max_models` and `max_bytes` of parameters."""

    def __init__(self, max_models: int | None = None, max_bytes: int | None = None) -> None:
        self.max_models = max_models or settings.get("model_cache_size")
        budget_mb = settings.get("model_cache_mb")
        self.max_bytes = max_bytes or (budget_mb * 2**20 if budget_mb else None)
        self._entries: OrderedDict[tuple, LoadedModel] = OrderedDict()

    @staticmethod
    def key(spec: ModelSpec, device) -> tuple:
        return (
            spec.path,
            spec.revision,
            spec.dtype,
            spec.trust_remote_code,
            spec.use_safetensors,
            spec.attention,
            str(device),
        )

    def get(self, spec: ModelSpec, device) -> LoadedModel:
        key = self.key(spec, device)
        if key in self._entries:
            self._entries.move_to_end(key)
            entry = self._entries[key]
            entry.uses += 1
            return entry
        entry = load(spec, device)
        self._entries[key] = entry
        self._evict(keep=key)
        return entry

    def _evict(self, keep: tuple) -> None:
        def over() -> bool:
            total = sum(e.nbytes for e in self._entries.values())
            return len(self._entries) > self.max_models or (self.max_bytes is not None and total > self.max_bytes)

        while over() and len(self._entries) > 1:
            key, entry = next(iter(self._entries.items()))
            if key == keep:
                break
            del self._entries[key]
            log.info("model.evicted", model=entry.spec.label)
            if entry.device.type == "cuda":
                import torch

                del entry
                torch.cuda.empty_cache()

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[LoadedModel]:
        """The loaded models, least recently used first."""
        return list(self._entries.values())
