"""Loading models and tokenizers, an LRU cache of loaded models per worker, and what a model takes.

A worker process keeps its loaded models across jobs (RQ runs jobs in-process),
bounded by a count and a parameter-memory budget.

`probes(model)` answers, once per model object, what its forward pass takes: the name of its
KV-cache keyword, whether it computes the last position's logits only (`logits_to_keep`),
whether its layers take the preallocated cache (worker.engine.kvcache), whether transformers'
own cache can be reordered (the steps of beam, diverse beam and contrastive search), and
whether decode steps may pass SDPA a prepared mask (`prepared_mask`). The answers live in a
table beside the models, never on them.
"""

from __future__ import annotations

import inspect
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from worker.core import hub
from worker.core.contract import ModelSpec
from worker.core.errors import ModelUnavailableError
from worker.core.hub import unavailable_reason
from worker.engine.checkpoint import check_fit, check_local, content_hash, first_line, refused

log = structlog.get_logger("decodebench.models")

_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


@dataclass
class LoadedModel:
    spec: ModelSpec
    model: Any
    tokenizer: Any
    device: Any
    info: dict[str, Any]
    warmed: set[tuple] = field(default_factory=set)  # the plans' `warm_key`s warmed on it (generate.warm_up)
    nbytes: int = 0
    uses: int = field(default=0)


def quiet_transformers() -> None:
    """transformers' own progress bars and warnings would interleave with decodebench's output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _load_tokenizer(spec: ModelSpec, kwargs: dict[str, Any]):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(spec.path, **kwargs)
    # a tokenizer.json of the wrong shape surfaces as whichever lookup failed on it
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        hub = unavailable_reason(err)  # the hub, not the tokenizer, is what failed: say so, with the fix
        raise refused(spec, hub or f"its tokenizer cannot load: {type(err).__name__}: {first_line(err)}") from None


def _hub_kwargs(spec: ModelSpec) -> dict[str, Any]:
    """A hub id's loading arguments. Where the hub's host does not answer one TCP probe (seconds), the
    hub client would retry every file with back-off (about 25 s, a warning line each): a cached model
    loads from the cache alone, an uncached one is refused at once with the cause and the fix."""
    kwargs: dict[str, Any] = {"revision": spec.revision} if spec.revision else {}
    if hub.offline() or hub.hub_reachable() is not False:
        return kwargs
    try:
        hub.resolve(spec.path, spec.revision, reachable=False)
    except ModelUnavailableError as err:
        raise refused(spec, str(err)) from None
    return {**kwargs, "local_files_only": True}


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
        raise refused(spec, "the local path does not exist on this worker")
    if is_local:
        check_local(spec, local)
    kwargs: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code, **({} if is_local else _hub_kwargs(spec))}
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
        raise refused(
            spec, f"its safetensors weights cannot be read (empty or truncated?): {first_line(err)}"
        ) from None
    except (OSError, ValueError) as err:
        raise refused(spec, unavailable_reason(err) or f"cannot load: {first_line(err)}") from None
    check_fit(spec, model, loading, tokenizer)
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
    """LRU of loaded models, bounded by `max_models` and `max_bytes` of parameters (None: no limit)."""

    def __init__(self, max_models: int, max_bytes: int | None = None) -> None:
        self.max_models = max_models
        self.max_bytes = max_bytes
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


# Model families whose forward uses the attention mask only to build its causal mask (read in
# transformers 5.24's modeling files), so a ready 4D boolean mask passes through unchanged.
MASK_PASSTHROUGH = frozenset(
    {"gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox", "phi3", "gemma", "olmo2", "smollm3"}
)


@dataclass
class Probes:
    """What one model's forward pass takes (answered once per model object; `probes`)."""

    cache_keyword: str  # transformers >= 5.2x names the KV cache `cache`; earlier releases `past_key_values`
    last_logits: bool  # the forward takes `logits_to_keep`: the logits of the last position only
    preallocated: bool  # its layers are plain full-attention layers: the preallocated cache (kvcache)
    reorderable: bool  # transformers' own cache is plain attention layers, which beam search reorders
    prepared_mask: bool | None = None  # decode steps may pass SDPA the prepared mask (None: not asked yet)


_PROBED: weakref.WeakKeyDictionary[Any, Probes] = weakref.WeakKeyDictionary()


def probes(model) -> Probes:
    """The model's probes, answered on the first call for this model object."""
    found = _PROBED.get(model)
    if found is None:
        from worker.engine.kvcache import preallocated_cache, reorderable

        params = inspect.signature(model.forward).parameters
        found = Probes(
            cache_keyword="cache" if "cache" in params else "past_key_values",
            last_logits="logits_to_keep" in params,
            preallocated=preallocated_cache(model, 1) is not None,
            reorderable=reorderable(model),
        )
        _PROBED[model] = found
    return found


def cache_keyword(model) -> str:
    return probes(model).cache_keyword


def last_logits_only(model) -> dict[str, int]:
    """The forward keyword that computes the logits of the last position only, where the model has it."""
    return {"logits_to_keep": 1} if probes(model).last_logits else {}


def prepared_mask(model) -> bool:
    """Whether decode steps give SDPA its boolean mask ready-made (rows.attn as (rows, 1, 1, columns)),
    given the preallocated cache (plain full-attention layers: a sliding-window layer needs
    transformers' own mask).

    transformers rebuilds the mask from the 2D one at every step, and for SDPA checks whether it
    has any padding (`fast_all`): a host synchronisation per token on CUDA, and on the CPU a
    little of a small model's step. The prepared mask is the same mask. The families listed were
    read in transformers 5.24; a model of one is also checked once, when first asked (another
    transformers release may read the mask otherwise): a decode step of a padded batch must give
    bit-identical logits with either mask, or the loop keeps transformers' mask for it.
    """
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa" or config.model_type not in MASK_PASSTHROUGH:
        return False
    found = probes(model)
    if found.prepared_mask is None:
        found.prepared_mask = found.preallocated and _same_logits_either_mask(model, found.cache_keyword)
    return found.prepared_mask


def sdpa_mask(attn):
    """A decode step's prepared mask: the 2D mask as (rows, 1, 1, columns) booleans, True = attend."""
    return attn[:, None, None, :].bool()


def _same_logits_either_mask(model, keyword: str) -> bool:
    """One decode step of a two-row batch, one row left-padded, with transformers' mask and with the
    prepared one: whether the logits are bit-identical."""
    import torch

    from worker.engine.kvcache import preallocated_cache

    logits = []
    try:
        device = model.device
        ids = torch.tensor([[1, 2, 3], [4, 5, 6]], device=device) % model.config.vocab_size
        attn = torch.tensor([[0, 1, 1], [1, 1, 1]], device=device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        step = torch.cat([attn, attn.new_ones(2, 1)], dim=-1)
        with torch.inference_mode():
            for mask in (step, sdpa_mask(step)):
                cache = preallocated_cache(model, 4)
                model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **{keyword: cache})
                out = model(
                    input_ids=ids[:, -1:],
                    attention_mask=mask,
                    position_ids=pos[:, -1:] + 1,
                    use_cache=True,
                    **{keyword: cache},
                )
                logits.append(out.logits[:, -1])
    except Exception:  # a model this probe cannot run, or one that refuses the prepared mask: transformers' own
        return False
    return torch.equal(*logits)
