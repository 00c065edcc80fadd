"""Planning: `plan(spec) -> list[JobSpec]`, a pure function of the spec and its prompts.

One job per (model, strategy variant, seed, prompt shard). List-valued strategy
parameters expand to a grid; deterministic strategies run with the first seed only.
A variant's `samples` (n generations per prompt) add no jobs: each seed's job generates
n samples of every prompt of its shard, so a cell holds seeds x n generations per prompt.
Ids are content hashes, so the same spec always yields the same ids; a variant without
samples hashes as it did before samples existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controller.metrics.registry import METRICS, worker_needs
from controller.sweep.judgespec import JudgeLimits
from controller.sweep.models import SweepSpec, expand_grid, over_limit, spec_hash
from controller.sweep.prompts import load_prompts
from worker.core import settings
from worker.core.contract import FEATURIZER_MAX_TOKENS, JobSpec, PromptItem, StrategySpec
from worker.core.engines import DEFAULT_ENGINES, engine_label, is_default
from worker.core.errors import UsageError
from worker.core.settings import check_tenant
from worker.strategies import get_strategy, samples_label, variant_label

ID_LEN = 16


__all__ = ["expand_grid", "plan", "summarize_plan", "variants"]


def variants(spec: SweepSpec) -> list[StrategySpec]:
    """Every concrete strategy variant, defaults filled in, duplicates dropped (`repeated_variants` names them),
    spec order kept."""
    return [variant for variant, _, first in _entries(spec) if first is None]


def repeated_variants(spec: SweepSpec) -> list[str]:
    """A line for each variant an entry of `strategies` repeats (the same strategy and parameters, defaults filled
    in, as an earlier entry's or its own grid's): planned once, one cell, which `validate` and `run` say."""
    lines = []
    for variant, i, first in _entries(spec):
        if first is not None:
            where = "an earlier value of its own grid" if first == i else f"strategies[{first}]"
            label = variant_label(variant.name, variant.params)
            lines.append(f"strategies[{i}]: {label} repeats {where} (with defaults filled in): planned once")
    return lines


def _entries(spec: SweepSpec):
    """(variant, the index of its entry in `strategies`, the index of the entry that had it first or None)."""
    seen: dict[str, int] = {}
    for i, entry in enumerate(spec.strategies):
        strategy = get_strategy(entry.name)
        for combo in expand_grid(entry.params):
            variant = StrategySpec(
                name=entry.name, params=strategy.validate(combo), samples=entry.samples, best_of=entry.best_of
            )
            key = spec_hash(_identity(variant))
            yield variant, i, seen.get(key)
            seen.setdefault(key, i)


def _identity(variant: StrategySpec) -> list:
    """What tells variants apart: name and parameters, and samples and best_of only where set (so a variant
    without them keeps the ids it had before they existed)."""
    samples = [] if variant.samples is None else [{"samples": variant.samples, "best_of": variant.best_of}]
    return [variant.name, variant.params, *samples]


def count_jobs(spec: SweepSpec, n_prompts: int) -> int:
    """The jobs `plan` makes at most, counted from the spec without expanding anything."""
    n = min(n_prompts, spec.prompts.limit) if spec.prompts.limit else n_prompts
    return spec.jobs_per_shard() * -(-n // spec.prompts.shard_size)


def check_size(spec: SweepSpec, n_prompts: int) -> int:
    """The job count, or a UsageError naming it and DECODEBENCH_MAX_JOBS if it is over the limit."""
    count = count_jobs(spec, n_prompts)
    if count > settings.get("max_jobs"):
        raise UsageError(over_limit(count, "the sweep plans up to"))
    return count


def planned_size(spec: SweepSpec, prompts: list[PromptItem]) -> tuple[int, int]:
    """(the jobs `plan` makes of these prompts, the characters of their prompt texts and references: a lower
    bound of their serialised payloads), counted without building a job: the submission server refuses an
    over-quota sweep from these before it plans and serialises anything."""
    runs = sum(
        len(spec.generation.seeds) if get_strategy(s.name).stochastic else 1 for _, _, s in _cells(spec, variants(spec))
    )
    text = sum(len(p.prompt) + len(p.reference or "") for p in prompts)
    return runs * -(-len(prompts) // spec.prompts.shard_size), runs * text


def check_answers(spec: SweepSpec, prompts: list[PromptItem]) -> None:
    """A UsageError where the sweep names a metric that could have no value: one that needs gold answers or
    references and no prompt has one, or MAUVE's features and the sweep has no `featurizer:` (a sweep that named
    only `mauve` without one got a report without a quality column, and no word why)."""
    source = spec.prompts.path or "prompts.inline"
    for n in spec.metrics or []:
        metric = METRICS.get(n)
        if metric.worker_computes == "featurize" and spec.featurizer is None:
            raise UsageError(f"metrics: {n} needs a `featurizer:` model (docs/sweeps.md), and the sweep has none")
        if metric.needs_answers and not any(p.answer for p in prompts):
            raise UsageError(f"metrics: {n} needs the prompts' gold `answer`, but no prompt of {source} has one")
        if metric.needs_references and not any(p.reference for p in prompts):
            raise UsageError(f"metrics: {n} needs the prompts' `reference`, but no prompt of {source} has one")


def check_baseline(option: str, baseline: str | None, cells: Sequence[tuple[str, str]]) -> None:
    """A baseline (the report's `--baseline`, a sweep's `judge.baseline`) names a cell key or a strategy of the
    sweep (controller.report.stats.paired.baselines): else one line naming what it has, not a report without
    comparisons. `cells`: each cell's (key, strategy name)."""
    if baseline is None or not cells or any(baseline in cell for cell in cells):
        return
    strategies = ", ".join(dict.fromkeys(strategy for _, strategy in cells))
    raise UsageError(
        f"{option} {baseline!r}: no strategy or cell of this sweep has that name (its strategies: {strategies};"
        f" a cell is named model::variant, as in summary.csv's cell column, e.g. {cells[0][0]!r})"
    )


_LATER_DEFAULTS = [
    ("models", "attention", "sdpa"),
    ("generation", "static_cache", False),
    ("generation", "refill", True),
]
# top-level settings added later: left out of the sweep id while they have their default
_LATER_TOP_DEFAULTS = [
    ("featurizer", None),
    ("featurizer_max_tokens", FEATURIZER_MAX_TOKENS),
    ("engines", DEFAULT_ENGINES),
    ("task", None),
    ("judge", None),
]


def _extra_models(normalised: dict) -> list[dict]:
    """The sweep-wide models besides the cells' own (scorer, featurizer) that are set."""
    return [normalised[k] for k in ("scorer", "featurizer") if normalised.get(k)]


def compute_sweep_id(
    spec: SweepSpec, tenant: str, prompts: list[PromptItem], strategies: list[StrategySpec] | None = None
) -> str:
    """Hash of the normalised spec and the tenant: the prompt file replaced by its content,
    local model paths taken relative to the spec file, defaults filled in."""
    normalised = spec.model_dump(mode="json", exclude={"description"})
    # settings added after sweeps existed count only when set, so those sweeps keep their ids
    for name, default in _LATER_TOP_DEFAULTS:
        if normalised.get(name) == default:
            normalised.pop(name, None)
    models = normalised["models"] + _extra_models(normalised)
    for section, name, default in _LATER_DEFAULTS:
        for entry in models if section == "models" else [normalised[section]]:
            if entry.get(name) == default:
                entry.pop(name, None)
    normalised["prompts"] = {
        "items": spec_hash([p.model_dump() for p in prompts]),
        "shard_size": spec.prompts.shard_size,
    }
    for model in normalised["models"] + _extra_models(normalised):
        model["path"] = spec.portable_path(model["path"])
    if normalised.get("judge"):  # what a report may spend is not what the sweep is: raising a limit keeps the id
        normalised["judge"]["limits"] = JudgeLimits().model_dump(mode="json")
    for name in ("template", "api_key_file"):  # a judge's local files, like the models' paths
        if (normalised.get("judge") or {}).get(name):
            normalised["judge"][name] = spec.portable_path(normalised["judge"][name])
    if (normalised.get("judge") or {}).get("local"):
        normalised["judge"]["local"]["path"] = spec.portable_path(normalised["judge"]["local"]["path"])
    normalised["strategies"] = []
    for v in variants(spec) if strategies is None else strategies:
        kinds = get_strategy(v.name).all_params
        params = {k: spec.portable_path(x) if kinds[k].is_path else x for k, x in v.params.items()}
        normalised["strategies"].append({"name": v.name, "params": params, **v.model_dump(exclude={"name", "params"})})
    return spec_hash({"tenant": tenant, "spec": normalised})[:ID_LEN]


def cell_key(model_label: str, strategy: StrategySpec, engine=None) -> str:
    """`model::variant`, and `::engine` after it for any engine but the own one (whose cells keep their names);
    a variant with samples says so after its parameters (`[samples=8]`)."""
    variant = variant_label(strategy.name, strategy.params) + samples_label(strategy.samples, strategy.best_of)
    key = f"{model_label}::{variant}"
    return key if is_default(engine) else f"{key}::{engine_label(engine)}"


def plan(spec: SweepSpec, tenant: str = "default", prompts: list[PromptItem] | None = None) -> list[JobSpec]:
    """All jobs of the sweep, grouped by model so that a worker reuses a loaded model."""
    check_tenant(tenant)
    prompts = load_prompts(spec.prompts) if prompts is None else prompts
    check_size(spec, len(prompts))
    check_answers(spec, prompts)
    strategies = variants(spec)
    if spec.judge is not None and spec.judge.mode == "pairwise":  # else a report judging nothing, without a word
        cells = [(cell_key(m.label, s, e), s.name) for m, e, s in _cells(spec, strategies)]
        check_baseline("judge.baseline", spec.judge.baseline, cells)
    sweep_id = compute_sweep_id(spec, tenant, prompts, strategies)
    size = spec.prompts.shard_size
    shards = [prompts[i : i + size] for i in range(0, len(prompts), size)]
    settings = spec.generation.settings()
    metrics = spec.metrics if spec.metrics is not None else []
    compute = worker_needs(metrics)  # what the metrics need the worker to compute with a model
    jobs = []
    for model, engine, strategy in _cells(spec, strategies):
        seeds = spec.generation.seeds if get_strategy(strategy.name).stochastic else spec.generation.seeds[:1]
        for seed in seeds:
            for index, shard in enumerate(shards):
                coords = [sweep_id, model.label, strategy.name, strategy.params, seed, index]
                if strategy.samples is not None:  # jobs without samples keep the ids they had before samples
                    coords.append(_identity(strategy)[-1])
                if not is_default(engine):  # the own engine's jobs keep the ids they had before engines
                    coords.append(engine_label(engine))
                jobs.append(
                    JobSpec(
                        tenant=tenant,
                        sweep_id=sweep_id,
                        sweep_name=spec.name,
                        job_id=spec_hash(coords)[:ID_LEN],
                        cell=cell_key(model.label, strategy, engine),
                        model=model,
                        strategy=strategy,
                        seed=seed,
                        shard=index,
                        n_shards=len(shards),
                        prompts=shard,
                        generation=settings,
                        metrics=metrics,
                        compute=compute,
                        scorer=spec.scorer,
                        featurizer=spec.featurizer,
                        featurizer_max_tokens=spec.featurizer_max_tokens,
                        timeout_s=spec.job_timeout_s,
                        engine=None if is_default(engine) else engine,
                    )
                )
    return jobs


def _cells(spec: SweepSpec, strategies: list[StrategySpec]):
    """(model, engine, strategy variant) of every cell, grouped by model and engine so that a worker reuses
    a loaded model."""
    return [(m, e, s) for m in spec.models for e in spec.engines for s in strategies]


@dataclass(frozen=True)
class PlanSummary:
    sweep_id: str
    cells: int
    jobs: int
    prompts: int
    generations: int
    max_new_tokens: int

    @property
    def tokens_to_generate(self) -> int:
        """Upper bound: every generation runs to max_new_tokens."""
        return self.generations * self.max_new_tokens


def summarize_plan(jobs: list[JobSpec]) -> PlanSummary:
    first = jobs[0]
    return PlanSummary(
        sweep_id=first.sweep_id,
        cells=len({j.cell for j in jobs}),
        jobs=len(jobs),
        prompts=len({p.id for j in jobs for p in j.prompts}),
        generations=sum(len(j.prompts) * j.strategy.n_samples for j in jobs),
        max_new_tokens=first.generation.max_new_tokens,
    )
