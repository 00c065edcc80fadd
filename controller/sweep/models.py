"""The sweep spec: pydantic v2 models (`controller.sweep.load` reads them from YAML or JSON).

The JSON schema (`decodebench validate --schema`) is generated from these models.
Every error names its field path, e.g. `strategies[1].params.p: must be <= 1.0`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from controller.metrics import METRICS
from controller.metrics.extract import TaskSpec
from controller.sweep.judgespec import JudgeSpec
from controller.sweep.prompts import PromptSet
from controller.sweep.wording import at, plural, repeated
from worker.core import settings
from worker.core.contract import (
    FEATURIZER_MAX_TOKENS,
    JOB_TIMEOUT_DEFAULT,
    MAX_SAMPLES,
    SEED_MAX,
    SEED_MIN,
    BestBy,
    FeaturizerMaxTokens,
    GenerationSettings,
    JobTimeoutS,
    ModelSpec,
)
from worker.core.engines import EngineSpec, OwnEngine, engine_label
from worker.core.errors import short
from worker.strategies import BROKEN_PLUGINS, STRATEGIES

Seed = Annotated[int, Field(strict=True, ge=SEED_MIN, le=SEED_MAX)]
Samples = Annotated[int, Field(strict=True, ge=1, le=MAX_SAMPLES)]


def grid_size(params: dict[str, Any]) -> int:
    """How many variants `params` expands to, counted without expanding them."""
    return math.prod(len(v) if isinstance(v, list) else 1 for v in params.values())


def expand_grid(params: dict[str, Any]) -> list[dict[str, Any]]:
    """`{"p": [0.9, 0.95], "temperature": 1}` -> two dicts, keys in sorted order."""
    keys = sorted(params)
    axes = [params[k] if isinstance(params[k], list) else [params[k]] for k in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*axes)]


def over_limit(count: int, what: str) -> str:
    """The message for a sweep of `count` jobs over DECODEBENCH_MAX_JOBS."""
    limit = settings.get("max_jobs")
    return f"{what} {count:,} {plural(count, 'job')}, over the limit of {limit:,} (DECODEBENCH_MAX_JOBS)"


def _unusable_label(label: str) -> str | None:
    """Why a model's label (its `name`, else its path's last part) cannot name its cells, or None: a cell key is
    `model::variant` (`::engine` after it), which `status --watch` splits back into its parts."""
    if not label.strip():
        return "is empty"
    if "::" in label:
        return "holds '::', which separates a cell key's parts"
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StrategyEntry(_Strict):
    """A strategy and its parameters; a list-valued parameter expands to a grid."""

    name: str = Field(description="A registered strategy (see `decodebench strategies`).")
    params: dict[str, Any] = Field(
        default_factory=dict, description="Parameter values; a list gives one variant per value (grid over all lists)."
    )
    samples: Samples | None = Field(
        default=None,
        description="Stochastic strategies only: generations per prompt in one job (each with its own seed; the own "
        "engine prefills a prompt once for all of them), for every seed of the sweep (docs/sweeps.md#samples). "
        "At most DECODEBENCH_MAX_SAMPLES.",
    )
    best_of: BestBy | None = Field(
        default=None,
        description="With samples >= 2: keep, per prompt, the sample with the highest mean token log-probability "
        "under the generating model (model) or the sweep's scorer (scorer), reported like any generation.",
    )

    @model_validator(mode="after")
    def _check(self) -> StrategyEntry:
        if self.name not in STRATEGIES:
            raise ValueError(BROKEN_PLUGINS.get(self.name) or STRATEGIES.unknown_message(self.name))
        strategy = STRATEGIES.get(self.name)
        if self.samples is not None and not strategy.stochastic:
            raise at(
                ("samples",),
                f"strategy {self.name!r} is deterministic, so every sample would be the same generation; "
                "samples is for stochastic strategies",
            )
        if self.best_of is not None and (self.samples or 1) < 2:
            raise at(("best_of",), f"strategy {self.name!r} needs samples of at least 2 to keep the best of")
        variants = grid_size(self.params)  # before any value is looked at: a grid can be huge
        if variants > settings.get("max_jobs"):
            grid = f"the grid has {variants:,} {plural(variants, 'variant')}, so at least"
            raise at(("params",), over_limit(variants, grid))
        for key, value in self.params.items():
            if key not in strategy.all_params:
                raise ValueError(
                    f"params.{short(key, 40) if not key.isidentifier() else key}: unknown parameter for "
                    f"{self.name!r}; valid: {', '.join(sorted(strategy.all_params))}"
                )
            values = value if isinstance(value, list) else [value]
            if not values:
                raise ValueError(f"params.{key}: an empty list gives no variant")
            for v in values:
                try:
                    strategy.all_params[key].check(key, v)
                except ValueError as err:
                    raise ValueError(f"params.{err}") from None
        for key, param in strategy.all_params.items():
            if param.default is None and not param.optional and key not in self.params:
                raise ValueError(f"params.{key} is required for strategy {self.name!r}")
        if strategy.has_joint_rules:
            for combo in expand_grid(self.params):
                try:
                    strategy.validate(combo)
                except ValueError as err:
                    raise PydanticCustomError(
                        "joint_rule", "{rule}", {"rule": str(err), "strategy": self.name}
                    ) from None
        return self


class Generation(GenerationSettings):
    """Generation settings shared by all strategies, plus the seeds."""

    seeds: list[Seed] = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="Seeds; stochastic strategies run once per seed, deterministic ones once.",
    )

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, v: list[str]) -> list[str]:
        """An empty stop string is found at once: every generation would be empty. Checked on the sweep, not on
        the job (worker.core.contract), so that a job or result written before the check still loads."""
        if "" in v:
            raise ValueError(f"stop[{v.index('')}] is empty: an empty stop string would end every generation at once")
        return v

    @model_validator(mode="after")
    def _min_le_max(self) -> Generation:
        if self.min_new_tokens > self.max_new_tokens:
            raise at(("min_new_tokens",), "must not exceed max_new_tokens")
        if len(set(self.seeds)) != len(self.seeds):
            raise at(("seeds", repeated(self.seeds)), "seeds must be distinct")
        return self

    def settings(self) -> GenerationSettings:
        return GenerationSettings(**self.model_dump(exclude={"seeds"}))


class SweepSpec(_Strict):
    """A sweep: strategies x models x a prompt set."""

    name: str = Field(min_length=1, description="Human name of the sweep.")
    description: str = Field(default="", description="Free text kept with the sweep.")
    models: list[ModelSpec] = Field(min_length=1, description="Models to compare.")
    prompts: PromptSet = Field(description="The prompt set.")
    strategies: list[StrategyEntry] = Field(min_length=1, description="Strategies to compare.")
    generation: Generation = Field(default_factory=Generation, description="Shared generation settings.")
    metrics: list[str] | None = Field(default=None, description="Quality metrics to compute; default: all that apply.")
    task: TaskSpec | None = Field(
        default=None,
        description="How an answer is read from a generation and compared with the prompts' gold `answer` "
        "(docs/tasks.md); default: the whole generation, normalised.",
    )
    scorer: ModelSpec | None = Field(
        default=None,
        description="Model that scores perplexity and coherence for every cell; default: each cell's own model.",
    )
    featurizer: ModelSpec | None = Field(
        default=None,
        description="Model whose final hidden state at a text's last token is its MAUVE feature, for every cell "
        "(a local path or hub id; the published MAUVE numbers used gpt2-large); default: none, MAUVE is empty.",
    )
    featurizer_max_tokens: FeaturizerMaxTokens = Field(
        default=FEATURIZER_MAX_TOKENS,
        description="Prompt + text is cut to its first this many featurizer tokens before featurizing.",
    )
    job_timeout_s: JobTimeoutS = Field(
        default=JOB_TIMEOUT_DEFAULT, description="Wall-clock limit of one job on a worker (at most a year)."
    )
    engines: list[EngineSpec] = Field(
        default_factory=lambda: [OwnEngine()],
        min_length=1,
        description="Engines every (model, strategy) cell runs on, each with its settings (docs/engines.md); "
        "default: decodebench's own engine only.",
    )
    judge: JudgeSpec | None = Field(
        default=None,
        description="An LLM judge of the answers: pairwise against a baseline variant or 1-10 grading "
        "(docs/judge.md); default: none.",
    )
    # The spec file's directory: local paths enter the sweep id relative to it, so the same
    # sweep checked out in two places has one id.
    _base_dir: Path | None = PrivateAttr(default=None)

    @property
    def base_dir(self) -> Path | None:
        """The spec file's directory (None for a spec built in code)."""
        return self._base_dir

    @base_dir.setter
    def base_dir(self, value: Path | None) -> None:
        self._base_dir = value

    def portable_path(self, path: str) -> str:
        """`path` relative to the spec file's directory if it is a resolved local path."""
        if self._base_dir is not None and Path(path).is_absolute():
            return os.path.relpath(path, self._base_dir)
        return path

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: list[str] | None) -> list[str] | None:
        for name in v or []:
            if name not in METRICS:
                raise ValueError(METRICS.unknown_message(name))
        return v

    @model_validator(mode="after")
    def _enough_generations(self) -> SweepSpec:
        """`pass@k` and `maj@k` need k generations of a prompt from some strategy: seeds × samples."""
        for i, name in enumerate(self.metrics or []):
            prefix, _, k = name.partition("@")
            if prefix in ("pass", "maj") and k.isdigit() and int(k) > (most := self.generations_per_prompt()):
                made = f"at most {most}" if most > 1 else "1 (a deterministic strategy, or one seed)"
                raise at(
                    ("metrics", i),
                    f"{name} needs {k} generations of each prompt, but the sweep's strategies make {made}; "
                    f"give a sampling strategy at least {k} (seeds × samples)",
                )
        return self

    def generations_per_prompt(self) -> int:
        """The most generations of one prompt a cell of the sweep holds: seeds × samples of a stochastic strategy."""
        seeds = len(self.generation.seeds)
        return max(
            (seeds * (getattr(e, "samples", None) or 1) if STRATEGIES.get(e.name).stochastic else 1)
            for e in self.strategies
        )

    @model_validator(mode="after")
    def _unique_model_labels(self) -> SweepSpec:
        for i, model in enumerate(self.models):
            if why := _unusable_label(model.label):
                raise at(("models", i), f"label {short(model.label)} {why}; give the model another `name`")
        labels = [m.label for m in self.models]
        if (twice := repeated(labels)) is not None:
            raise at(
                ("models", twice), f"two models share the label {short(labels[twice])}; give them distinct `name`s"
            )
        return self

    @model_validator(mode="after")
    def _best_of_scorer(self) -> SweepSpec:
        for i, entry in enumerate(self.strategies):
            if entry.best_of == "scorer" and self.scorer is None:
                raise at(("strategies", i, "best_of"), "scorer needs the sweep's `scorer` model; none is set")
        return self

    @model_validator(mode="after")
    def _unique_engine_labels(self) -> SweepSpec:
        labels = [engine_label(e) for e in self.engines]
        if (twice := repeated(labels)) is not None:
            raise at(("engines", twice), f"two engines share the label {labels[twice]}; give them distinct `label`s")
        return self

    @model_validator(mode="after")
    def _bounded(self) -> SweepSpec:
        """At least one job per model, variant and seed: refuse a sweep over the limit before planning."""
        if self.jobs_per_shard() > settings.get("max_jobs"):
            raise ValueError(over_limit(self.jobs_per_shard(), "the sweep has at least"))
        return self

    def jobs_per_shard(self) -> int:
        """Jobs for each prompt shard (an upper bound: duplicate variants are planned once), counted."""
        seeds = len(self.generation.seeds)
        per_model = sum(
            grid_size(e.params) * (seeds if STRATEGIES.get(e.name).stochastic else 1) for e in self.strategies
        )
        return len(self.models) * per_model * len(self.engines)


def spec_hash(obj: Any) -> str:
    """sha256 of the canonical JSON of `obj`."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def json_schema() -> dict:
    return SweepSpec.model_json_schema()
