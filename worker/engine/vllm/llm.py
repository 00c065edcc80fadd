"""One `vllm.LLM` per worker process, kept for the next job of the same model and engine settings.

The engine core runs in the worker's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0): no spawned
process (no main guard needed in the caller), RSS telemetry sees the model, and one process holds
one engine. A model vLLM cannot load (an architecture it lacks, max_model_len past the model's
positions) is a `PermanentJobError` with vLLM's own reason in one line, never a traceback.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import time
from dataclasses import dataclass, field
from typing import Any

from worker.core.contract import ModelSpec
from worker.core.engines import VLLM_INSTALL, VllmEngine
from worker.core.errors import PermanentJobError
from worker.core.policy import model_positions
from worker.engine.vllm.logitsprocs import PATH as PROCESSOR_PATH
from worker.engine.vllm.logitsprocs import processor_class


@dataclass
class LoadedLLM:
    key: tuple
    llm: Any
    kwargs: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)


def llm_kwargs(model: ModelSpec, engine: VllmEngine, device_type: str, filters: bool = False) -> dict[str, Any]:
    """`vllm.LLM`'s keyword arguments for this model and engine entry (pure); `filters`: with the logits
    processor of typical, epsilon and eta (only their cells' LLM has it: every other cell runs plain vLLM)."""
    dtype = engine.dtype if engine.dtype != "auto" else model.dtype
    kwargs: dict[str, Any] = {
        "model": model.path,
        "tokenizer": model.path,
        "revision": model.revision,
        "dtype": dtype,
        "trust_remote_code": model.trust_remote_code,
        "disable_log_stats": False,  # per-request metrics (arrival, first token, finish) in RequestOutput
        "max_logprobs": -1,  # the distribution check reads the whole vocabulary's (worker.engine.vllm.selfcheck)
        **engine.llm_kwargs(),
    }
    if device_type != "cuda":
        kwargs.pop("gpu_memory_utilization", None)
    if filters:
        kwargs["logits_processors"] = [PROCESSOR_PATH]
    return kwargs


def _check_positions(model: ModelSpec, engine: VllmEngine) -> None:
    """max_model_len past the model's positions: one line before vLLM allocates anything."""
    if engine.max_model_len is None:
        return
    config_path = os.path.join(model.path, "config.json")
    if not os.path.isfile(config_path):
        return
    import json

    with open(config_path, encoding="utf-8") as f:
        positions = model_positions(json.load(f))
    if positions is not None and engine.max_model_len > positions:
        raise PermanentJobError(
            f"engine vllm: max_model_len {engine.max_model_len} is beyond model {model.label}'s {positions} positions"
        )


# On the CPU, vLLM otherwise reserves gpu_memory_utilization (0.92) of the host's memory and refuses to
# start where less is free: a worker shares its host, so the KV cache gets this much unless set.
CPU_KV_CACHE_DEFAULT_GB = 1
_USER_V2_RUNNER = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")  # what the other cells run with


def _environment(engine: VllmEngine, device_type: str, filters: bool) -> dict[str, str]:
    """Set vLLM's variables for this LLM; those that differ from vLLM's defaults, for the record."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # The logits processor implements vLLM's V1 model runner interface; Model Runner V2 (vLLM's default
    # on a GPU with Triton) takes another. Only typical, epsilon and eta cells run on V1 for it.
    if filters:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    elif _USER_V2_RUNNER is None:
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    else:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = _USER_V2_RUNNER
    if engine.kv_cache_space_gb is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{engine.kv_cache_space_gb:g}"
    elif device_type != "cuda":
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(CPU_KV_CACHE_DEFAULT_GB)
    names = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_CPU_KVCACHE_SPACE")
    return {k: os.environ[k] for k in names if k in os.environ}


def _cache_info(llm) -> dict[str, Any]:
    """KV cache size as vLLM reports it (blocks, block size, tokens), where it does."""
    try:
        cache = llm.llm_engine.vllm_config.cache_config
    except AttributeError:
        return {}
    blocks = getattr(cache, "num_gpu_blocks", None)
    size = getattr(cache, "block_size", None)
    return {
        "num_blocks": blocks,
        "block_size": size,
        "tokens": blocks * size if blocks and size else None,
        "cache_dtype": str(getattr(cache, "cache_dtype", None)),
        "prefix_caching": getattr(cache, "enable_prefix_caching", None),
    }


def one_line(err: BaseException) -> str:
    """vLLM's reason for a failure on one line, at most 300 characters (its type where it says nothing)."""
    return (" ".join(str(err).split()) or type(err).__name__)[:300]


class LLMCache:
    """The process's one LLM; a job for another model or other settings replaces it."""

    def __init__(self) -> None:
        self.loaded: LoadedLLM | None = None

    def get(self, model: ModelSpec, engine: VllmEngine, device_type: str, filters: bool = False) -> LoadedLLM:
        kwargs = llm_kwargs(model, engine, device_type, filters)
        key = (tuple(sorted((k, str(v)) for k, v in kwargs.items())), engine.kv_cache_space_gb)
        if self.loaded is not None and self.loaded.key == key:
            return self.loaded
        if importlib.util.find_spec("vllm") is None:  # an own-engine worker: one permanent reason, not ImportError
            raise PermanentJobError(f"engine vllm: vLLM is not installed in this worker's environment; {VLLM_INSTALL}")
        _check_positions(model, engine)  # before the loaded LLM is let go: a refused job keeps it
        self.close()
        env = _environment(engine, device_type, filters)
        started = time.perf_counter()
        try:
            from vllm import LLM

            llm = LLM(**{**kwargs, "logits_processors": [processor_class()]} if filters else kwargs)
        except Exception as err:  # vLLM's reason (an unsupported architecture, a length past the model) in one line
            raise PermanentJobError(f"engine vllm cannot load model {model.label}: {one_line(err)}") from None
        info = {"load_s": round(time.perf_counter() - started, 3), "kv_cache": _cache_info(llm), "env": env}
        self.loaded = LoadedLLM(key, llm, kwargs, info)
        return self.loaded

    def close(self) -> None:
        if self.loaded is not None:
            self.loaded = None
            gc.collect()
