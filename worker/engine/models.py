"""Loading models and tokenizers, and an LRU cache of loaded models per worker.

A worker process keeps its loaded models across jobs (RQ runs jobs in-process),
bounded by a count and a parameter-memory budget.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from worker.core import settings
from worker.core.contract import ModelSpec
from worker.core.errors import PermanentJobError

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


def load(spec: ModelSpec, device) -> LoadedModel:
    """Load tokenizer and model with the Auto classes; a missing model is a permanent job error."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    local = Path(spec.path)
    is_local = local.is_dir()
    if spec.path.startswith(("/", ".")) and not is_local:
        raise PermanentJobError(f"model {spec.label!r}: local path {spec.path} does not exist on this worker")
    kwargs: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code}
    if spec.revision and not is_local:
        kwargs["revision"] = spec.revision
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.path, **kwargs)
        dtype = getattr(torch, _DTYPES[spec.dtype]) if spec.dtype != "auto" else "auto"
        model = AutoModelForCausalLM.from_pretrained(
            spec.path, dtype=dtype, use_safetensors=spec.use_safetensors, **kwargs
        )
        attention = spec.attention if spec.attention == "eager" or model._supports_sdpa else "eager"
        model.set_attn_implementation(attention)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PermanentJobError(f"model {spec.label!r} ({spec.path}): cannot load: {first}") from None
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
