"""The job contract shared by the controller and the worker.

A `JobSpec` is everything a worker needs to run one job: it travels as JSON (never
pickle) through RQ and is recorded verbatim in the job's `result.json`.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_serializer, model_validator

from worker.core.chatformat import ChatMessage, template_variables
from worker.core.engines import EngineSpec

SCHEMA_VERSION = 1
Dtype = Literal["auto", "float32", "float16", "bfloat16"]
StopReason = Literal["eos", "length", "stop_string"]
# What the backend takes: seeds are 64-bit (torch.Generator), token counts and batch sizes
# far below what a tensor index overflows at, a timeout at most a year.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_NEW_TOKENS = 2**20
MAX_BATCH_SIZE = 2**16
MAX_SAMPLES = 2**16  # generations per prompt a variant can name at all; the policy's cap (Limits) is lower
JOB_TIMEOUT_MAX = 365 * 24 * 3600
# MAUVE features: texts cut to their first FEATURIZER_MAX_TOKENS tokens (mauve-text's default max_text_length).
FEATURIZER_MAX_TOKENS = 1024
FEATURIZER_MAX_TOKENS_LIMIT = 2**16
JOB_TIMEOUT_DEFAULT = 3600
# The bounds a sweep and a job share (each declares its field with its own description).
FeaturizerMaxTokens = Annotated[int, Field(strict=True, ge=1, le=FEATURIZER_MAX_TOKENS_LIMIT)]
JobTimeoutS = Annotated[int, Field(strict=True, ge=1, le=JOB_TIMEOUT_MAX)]
# What a worker computes besides the generations, for the metrics that need a model.
WorkerNeed = Literal["score", "featurize"]
# What ranks a best_of variant's samples: the generating model's mean token log-probability, or the scorer's.
BestBy = Literal["model", "scorer"]


class JobRef(NamedTuple):
    """Where a job sits in a sweep's state, in the order `worker.sweepstate`'s functions take it."""

    tenant: str
    sweep_id: str
    job_id: str
    cell: str


class Strict(BaseModel):
    """Base for every contract model: unknown keys are an error."""

    model_config = ConfigDict(extra="forbid")


class JobStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


def _without_unset(data: Any, defaults: dict[str, Any]) -> Any:
    """A serialised model without the fields added after results existed while they hold their defaults: the
    same payloads, signatures, sweep ids and result.json as before those fields."""
    if isinstance(data, dict):
        for key, default in defaults.items():
            if key in data and data[key] == default:
                del data[key]
    return data


class ModelSpec(Strict):
    """A causal language model to load with AutoModelForCausalLM."""

    path: str = Field(description="Local directory (relative to the spec file) or a hub id.")
    name: str | None = Field(default=None, description="Label in reports; defaults to the last part of `path`.")
    revision: str | None = Field(
        default=None, description="Hub revision (branch, tag or commit); ignored for local paths."
    )
    dtype: Dtype = Field(
        default="auto", description="Weights dtype: auto (the checkpoint's), float32, float16 or bfloat16."
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow the checkpoint's own Python code to run. Off by default."
    )
    use_safetensors: bool = Field(
        default=True, description="Load safetensors weights only (no pickle). Turn off only for trusted checkpoints."
    )
    attention: Literal["sdpa", "eager"] = Field(
        default="sdpa",
        description="Attention kernels: sdpa (torch's scaled_dot_product_attention; eager where the model has no "
        "SDPA support, recorded in the result) or eager.",
    )
    chat: bool | Literal["auto"] = Field(
        default="auto",
        description="Render each prompt with the tokenizer's chat template (docs/tasks.md): auto, where the tokenizer "
        "has one; true (a model without a template is refused); false, the raw prompt text.",
    )
    system: str | None = Field(
        default=None,
        description="System prompt put first in every conversation that has none of its own (chat models only).",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables passed to the chat template, e.g. {enable_thinking: false} (chat models only).",
    )

    @model_serializer(mode="wrap")
    def _without_default_chat(self, handler):
        return _without_unset(handler(self), {"chat": "auto", "system": None, "chat_template_kwargs": {}})

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, v: dict[str, Any]) -> dict[str, Any]:
        return template_variables(v)

    @field_validator("path")
    @classmethod
    def _path_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @property
    def label(self) -> str:
        return self.name or self.path.rstrip("/").split("/")[-1]


class StrategySpec(Strict):
    """One concrete strategy variant: a registered name and scalar parameters, and, for a stochastic
    strategy, how many generations a prompt gets (`samples`) and whether only the best is kept (`best_of`)."""

    name: str = Field(description="A registered strategy name (see `decodebench strategies`).")
    params: dict[str, Any] = Field(default_factory=dict, description="The strategy's parameters, one value each.")
    samples: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SAMPLES,
        description="Generations per prompt in one job, each with its own seed (the own engine prefills a prompt "
        "once for all of them); None: one.",
    )
    best_of: BestBy | None = Field(
        default=None,
        description="Keep, per prompt, only the sample with the highest mean token log-probability under the "
        "generating model (`model`) or the sweep's scorer (`scorer`); None: keep every sample.",
    )

    @model_serializer(mode="wrap")
    def _without_unset_samples(self, handler):
        """A variant without samples serialises as it did before them (no `samples`, `best_of` keys): the same
        payloads, signatures and result.json."""
        return _without_unset(handler(self), {"samples": None, "best_of": None})

    @property
    def n_samples(self) -> int:
        """Generations per prompt: `samples`, or one."""
        return self.samples or 1


class PromptItem(Strict):
    id: str = Field(description="Stable prompt id, unique within the prompt set.")
    prompt: str = Field(
        description="The text the model continues; for a chat model without `messages`, the user's turn. With "
        "`messages` and no `prompt`, the last user turn (what reports show)."
    )
    reference: str | None = Field(default=None, description="A reference continuation, if the prompt set has one.")
    messages: list[ChatMessage] | None = Field(
        default=None,
        description="The conversation a chat model's template renders (OpenAI chat format: [{role, content}]); "
        "only for models with a chat template.",
    )
    answer: list[str] | None = Field(
        default=None, description="The accepted gold answers of a task's prompt (docs/tasks.md); None: none."
    )
    choices: list[str] | None = Field(
        default=None, description="A multiple-choice prompt's choices, lettered A, B, ... in this order."
    )

    @field_validator("answer", mode="before")
    @classmethod
    def _one_or_several(cls, v: Any) -> Any:
        """One gold answer (a string or a number) is a list of one."""
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            return [str(v)]
        return v

    @model_validator(mode="before")
    @classmethod
    def _prompt_from_messages(cls, data: Any) -> Any:
        """With `messages` and no `prompt`: the last user turn is the prompt reports show."""
        if isinstance(data, dict) and data.get("prompt") is None and isinstance(data.get("messages"), list):
            turns = [m.get("content") for m in data["messages"] if isinstance(m, dict) and m.get("role") == "user"]
            if turns and isinstance(turns[-1], str):
                data = {**data, "prompt": turns[-1]}
        return data

    @field_validator("messages")
    @classmethod
    def _a_conversation(cls, v: list[ChatMessage] | None) -> list[ChatMessage] | None:
        if v is not None and not v:
            raise ValueError("an empty conversation")
        return v

    @model_serializer(mode="wrap")
    def _without_plain_fields(self, handler):
        return _without_unset(handler(self), {"messages": None, "answer": None, "choices": None})


class GenerationSettings(Strict):
    """Settings shared by every strategy of a sweep."""

    max_new_tokens: int = Field(
        default=64,
        strict=True,
        ge=1,
        le=MAX_NEW_TOKENS,
        description="Tokens to generate at most per prompt (at most 2**20).",
    )
    min_new_tokens: int = Field(
        default=0,
        strict=True,
        ge=0,
        le=MAX_NEW_TOKENS,
        description="Tokens to generate at least before EOS is allowed.",
    )
    batch_size: StrictInt | Literal["auto"] = Field(
        default=8,
        description="Prompts per batch (left-padded, sorted into length buckets; at most 2**16), or auto: the largest "
        "batch that fits the device (CUDA) or the fastest (CPU), probed once per model, device and lengths; the size "
        "used is recorded in the result.",
    )
    stop: list[str] = Field(
        default_factory=list,
        description="Stop strings (none empty): generation ends after any of them; the text is cut before it.",
    )
    warmup: bool = Field(default=True, description="Run one untimed warm-up batch before measuring.")
    static_cache: bool = Field(
        default=False,
        description="Opt-in: a static KV cache, with torch.compile of the forward pass on CUDA, where the installed "
        "transformers supports it for the model (else the dynamic cache, noted in the result). Rows then run to "
        "the batch's end (no compaction).",
    )
    decode_step: Literal["auto", "eager", "static", "graphs"] = Field(
        default="auto",
        description="The own engine's decode step (docs/performance.md#cuda-graphs): auto (the eager step; CUDA "
        "graphs once a GPU run has checked them), eager (a forward over each layer's window, every step), static "
        "(the bucketed static step over the whole preallocated buffers, run eagerly, on any device), graphs (the "
        "static step captured as CUDA graphs, one per bucket of rows; run eagerly where there is no CUDA). The "
        "static step and graphs apply to greedy search, sampling, beam and contrastive search and plugins' steps "
        "over the preallocated cache with the prepared mask; the eager step elsewhere. What ran is recorded per cell.",
    )
    refill: bool = Field(
        default=True,
        description="Continuous refill: where the engine's own loop decodes (greedy and sampling, penalties and "
        "minimum lengths applied row by row), rows freed by finished generations take the job's next prompts, so the "
        "job runs as one stream of batch_size rows; each generation then records its own latency and time to "
        "first token. false: one batch after another.",
    )

    @model_serializer(mode="wrap")
    def _without_later_defaults(self, handler):
        """Settings without `decode_step` while it is auto serialise as before it: the same payloads and signatures
        for workers that predate it (and the sweep id: controller.sweep.plan._LATER_DEFAULTS)."""
        return _without_unset(handler(self), {"decode_step": "auto"})

    @field_validator("batch_size")
    @classmethod
    def _positive_batch(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= MAX_BATCH_SIZE:
            raise ValueError(f"must be between 1 and {MAX_BATCH_SIZE}, or auto")
        return v


class JobSpec(Strict):
    """One job: a (model, strategy variant, seed, prompt shard) coordinate of a sweep."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(default=SCHEMA_VERSION, description="Contract version.")
    tenant: str = Field(description="Team that owns the sweep.")
    sweep_id: str = Field(description="Content hash of the normalised sweep spec and tenant.")
    sweep_name: str = Field(description="The sweep's human name.")
    job_id: str = Field(description="Content hash of the sweep id and the job's coordinates.")
    cell: str = Field(description="Key of the (model, strategy variant) cell this job belongs to.")
    model: ModelSpec
    strategy: StrategySpec
    seed: int = Field(
        ge=SEED_MIN, le=SEED_MAX, description="Base seed of the job (64-bit); each generation derives its own from it."
    )
    shard: int = Field(ge=0, description="Index of the prompt shard.")
    n_shards: int = Field(ge=1, description="Number of prompt shards of the sweep.")
    prompts: list[PromptItem] = Field(description="The shard's prompts.")
    generation: GenerationSettings
    metrics: list[str] = Field(default_factory=list, description="Metrics requested by the sweep.")
    compute: list[WorkerNeed] = Field(
        default_factory=lambda: ["featurize", "score"],
        description="What the worker computes for the metrics (written by the planner from the metric registry): "
        "score, each generation's token NLLs under the scorer; featurize, its MAUVE features under the featurizer "
        "(only where one is set). Default: both.",
    )
    scorer: ModelSpec | None = Field(
        default=None, description="Model that scores perplexity and coherence; None: the generating model."
    )
    featurizer: ModelSpec | None = Field(
        default=None,
        description="Model whose last-token final hidden state is each text's MAUVE feature; None: no features.",
    )
    featurizer_max_tokens: FeaturizerMaxTokens = Field(
        default=FEATURIZER_MAX_TOKENS,
        description="Texts are cut to their first this many featurizer tokens before featurizing (as mauve does).",
    )
    timeout_s: JobTimeoutS = Field(default=JOB_TIMEOUT_DEFAULT, description="Wall-clock limit of the job on a worker.")
    engine: EngineSpec | None = Field(
        default=None, description="The engine that runs the job and its settings; None: decodebench's own engine."
    )

    @property
    def ref(self) -> JobRef:
        return JobRef(self.tenant, self.sweep_id, self.job_id, self.cell)

    @model_serializer(mode="wrap")
    def _without_own_engine(self, handler):
        """An own-engine job serialises as it did before engines (no `engine` key): the same payloads,
        signatures and result.json for workers and readers that predate engines."""
        data = handler(self)
        if isinstance(data, dict) and data.get("engine") is None:
            data.pop("engine", None)
        return data
