"""What a job's results are: the lines of generations.jsonl (`GenerationRecord`) and result.json
(`JobResult`, with each batch's `BatchTiming`), as every engine writes them and every reader reads them.
The job itself is `worker.core.contract.JobSpec`."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_serializer

from worker.core.contract import SCHEMA_VERSION, JobSpec, JobStatus, PromptItem, StopReason, Strict, _without_unset


class GenerationRecord(Strict):
    """One line of generations.jsonl."""

    job_id: str
    cell: str
    model: str
    strategy: str
    params: dict[str, Any]
    seed: int = Field(description="The generation's own seed (derived from the job seed, prompt id and sample).")
    job_seed: int
    prompt_id: str
    sample: int = Field(
        default=0, ge=0, description="Which of the prompt's samples in its job (0 for a variant without samples)."
    )
    best_of: list[float] | None = Field(
        default=None,
        description="best_of: every sample's mean token log-probability, in sample order; this record is the one "
        "kept (`sample`). None: not a best_of variant.",
    )
    prompt: str
    reference: str | None = None
    answer: list[str] | None = Field(default=None, description="The prompt's accepted gold answers (a task's).")
    choices: list[str] | None = Field(default=None, description="The prompt's choices (multiple choice).")
    text: str
    token_ids: list[int]
    n_new_tokens: int
    stop_reason: StopReason
    batch: int = Field(description="Index of the batch that produced it within its job.")
    nll_sum: float | None = Field(default=None, description="Sum of token negative log-likelihoods under the scorer.")
    nll_count: int | None = Field(default=None, description="Tokens scored.")
    features: list[float] | None = Field(
        default=None, description="MAUVE feature of prompt + text under the sweep's featurizer (None: not computed)."
    )
    reference_features: list[float] | None = Field(
        default=None, description="MAUVE feature of prompt + reference under the featurizer (None: no reference)."
    )

    @model_serializer(mode="wrap")
    def _task_only_when_set(self, handler):
        return _without_unset(handler(self), {"answer": None, "choices": None})

    @classmethod
    def of(
        cls, job: JobSpec, prompt: PromptItem, *, seed: int, text: str, token_ids: list[int], **rest: Any
    ) -> GenerationRecord:
        """The record of one generation of `job` for `prompt` (what the job and prompt say, filled in here;
        the stop reason, batch and any scores and features in `rest`), as every engine writes it."""
        return cls(
            job_id=job.job_id,
            cell=job.cell,
            model=job.model.label,
            strategy=job.strategy.name,
            params=job.strategy.params,
            seed=seed,
            job_seed=job.seed,
            prompt_id=prompt.id,
            prompt=prompt.prompt,
            reference=prompt.reference,
            answer=prompt.answer,
            choices=prompt.choices,
            text=text,
            token_ids=token_ids,
            n_new_tokens=len(token_ids),
            **rest,
        )


class BatchTiming(Strict):
    """Raw timings of one generate() call; percentiles are computed only at report time."""

    @model_serializer(mode="wrap")
    def _without_eager_step(self, handler):
        """A batch of the eager decode step serialises as before the static one (no `decode_step` key)."""
        return _without_unset(handler(self), {"decode_step": None})

    n: int = Field(description="Prompts in the batch.")
    batch_size: int = Field(description="Batch size used (after any OOM halving).")
    input_tokens: int
    new_tokens: int
    prefill_s: float = Field(description="Start of generate() to the first logits (time to first token).")
    total_s: float = Field(description="Whole generate() call.")
    decode_s: float = Field(description="total_s - prefill_s.")
    steps: int | None = Field(
        default=None, description="Token positions generated (the longest row): 1 prefill + steps-1 decode steps."
    )
    energy_j: float | None = Field(
        default=None,
        description="Joules the device used during the batch (NVML total-energy counter; device-level). "
        "None where unavailable.",
    )
    compactions: int | None = Field(
        default=None,
        description="Times the engine's own loop dropped finished rows from the batch (None: generate() ran it).",
    )
    refills: int | None = Field(
        default=None, description="Times free rows took the job's next prompts (None: no continuous refill)."
    )
    decode_step: dict[str, Any] | None = Field(
        default=None,
        description="What the own engine's static decode steps did in this batch (worker.engine.graphs: steps, "
        "CUDA graph replays and captures, the buckets of rows used, failed captures, eager fallbacks, the graphs' "
        "pool in MiB); None where the eager step ran (docs/performance.md#cuda-graphs).",
    )
    latency_s: list[float] | None = Field(
        default=None,
        description="Per generation, in the batch's order: its start (prefill) to the step that picked its last "
        "token (with continuous refill; None: every generation's latency is total_s).",
    )
    ttft_s: list[float] | None = Field(
        default=None,
        description="Per generation: its start to its first token (with continuous refill; None: prefill_s).",
    )
    tpot_s: list[float | None] | None = Field(
        default=None,
        description="Per generation: (latency - ttft) / (its tokens - 1), the time per output token after the "
        "first as that generation saw it, other rows' prefills included (with continuous refill; None for a "
        "one-token generation; absent: decode_s / (steps - 1) for every row).",
    )


class JobResult(Strict):
    """result.json: written last, so its presence marks the job complete."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    job: JobSpec
    status: JobStatus = JobStatus.DONE
    started_at: str
    finished_at: str
    generation_config: dict[str, Any] = Field(
        description="Effective settings passed to transformers, defaults filled in."
    )
    batches: list[BatchTiming]
    load_s: float
    n_generations: int = Field(description="The generations written (best_of: the kept sample of each prompt).")
    new_tokens: int = Field(
        description="The written generations' new tokens: the batches' `new_tokens` sum to it, except under best_of, "
        "whose batches count every sample generated (what tokens/s counts) and this the kept ones."
    )
    generations_sha256: str | None = Field(
        default=None, description="sha256 of the generations.jsonl this result describes."
    )
    memory: dict[str, float | None] = Field(
        description="torch_peak_mb, rss_peak_mb, nvml_peak_mb, nvml_mean_mb, gpu_util_mean."
    )
    provenance: dict[str, Any]
    notes: list[str] = Field(
        default_factory=list, description="Things a reader should know (e.g. an OOM batch halving)."
    )
    engine: dict[str, Any] = Field(
        default_factory=dict,
        description="The engine's choices for this job: its plan (path, kind, step, cache, prepared mask, refill, "
        "warm-up, rows per prompt), decoding loop, batch size (requested, used, how chosen), "
        "bucketing, dtype, attention kernels, KV cache and compilation, sampler, compactions, energy source.",
    )


MODEL_ROLES = ("model", "scorer", "featurizer", "assistant")  # the models a result's provenance may record


def model_hashes(provenance: Any) -> dict[str, tuple[str, str]]:
    """path -> (label, content hash of its files) of each local model a result's provenance records (worker.engine.
    checkpoint's hash): its own, the scorer, the featurizer, an assisted strategy's draft; a hub model (no hash) or
    an entry not of that shape left out. What a resumed sweep and a report compare."""
    out: dict[str, tuple[str, str]] = {}
    for role in MODEL_ROLES:
        info = provenance.get(role) if isinstance(provenance, dict) else None
        if isinstance(info, dict) and isinstance(info.get("content_hash"), str) and isinstance(info.get("path"), str):
            label = info.get("label")
            out.setdefault(info["path"], (label if isinstance(label, str) else info["path"], info["content_hash"]))
    return out


def plugin_of(provenance: Any) -> str | None:
    """The plugin a result's strategy came from, as its provenance records it (`strategy_plugin`: "<entry point>
    (<distribution> <version>)", worker.strategies.plugins); None for a built-in strategy or a result recorded before
    it was. What a resumed sweep and a report compare."""
    plugin = provenance.get("strategy_plugin") if isinstance(provenance, dict) else None
    return plugin if isinstance(plugin, str) else None
