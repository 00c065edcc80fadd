"""Aggregation: a sweep's complete jobs -> one summary row per (model, strategy variant) cell.

Pure functions of their inputs; the only I/O is `load_sweep`, which reads through a Store.
Speed merges the raw per-batch timings of all the cell's jobs and takes ratios and
percentiles last; quality is recomputed with the metric registry from ALL the cell's
generations (never averaged per shard); every metric gets a 95% interval over prompt
resamples wherever each cell has at least MIN_CI_PROMPTS prompts, one seed or many; a
metric that does not apply is NaN, never 0; the `reference` row scores the prompt set's
own references. docs/reports.md has the details.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pandas as pd
import structlog
from pydantic import ValidationError

from controller.metrics import METRICS, CellData, Metric, cell_data
from controller.metrics.extract import task_section
from controller.report.compute.cache import ReportCache
from controller.report.compute.celljob import cell_job, cell_outputs
from controller.report.compute.cells import CellTask, Settings, cell_records, score
from controller.report.compute.columns import (
    COUNT_COLUMNS,
    DESIGN_COLUMNS,
    EXTRA_SPEED_COLUMNS,
    MAUVE_COLUMNS,
    QUALITY_COLUMNS,
    REFERENCE,
    SAMPLES_COLUMNS,
)
from controller.report.compute.engines import (
    DECODE_STEP_COLUMN,
    ENGINE_COLUMN,
    TRAILING,
    add_agreement,
    agreement_cells,
    engine_row,
    has_decode_steps,
    has_engines,
)
from controller.report.compute.pairs import CellRef, check_options, compare, held
from controller.report.compute.runner import Runner
from controller.report.load.jobs import MIN_CI_PROMPTS, JobInfo, enough_prompts, fewest_prompts, smallest_cell
from controller.report.load.sweep import SweepData, Tick
from controller.report.stats.bootstrap_t import CI_LEVEL
from controller.report.stats.cellstats import CellStats
from controller.report.stats.paired import FIRSTS_COLUMN, comparison_columns
from controller.report.stats.speed import SPREAD_COLUMNS, batch_units, speed_columns, speed_ranges
from worker.core.contract import ModelSpec, PromptItem
from worker.core.registry import Registry
from worker.core.results import GenerationRecord, JobResult
from worker.store import Store

# -- helpers ---------------------------------------------------------------------------


def params_json(params: Mapping[str, Any]) -> str:
    """Compact, key-sorted JSON: the `params` column."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


MetricSource = Registry[Metric] | Mapping[str, Metric]


def requested_metrics(data: SweepData, metrics: MetricSource = METRICS) -> list[tuple[str, Metric]]:
    """The metrics of `metrics` (a registry or a name -> Metric mapping) the sweep asked for, by name.

    An empty request means all of them.
    """
    asked = {m for r in data.results for m in r.job.metrics}
    if not asked:
        return sorted(metrics.items())
    return [(name, metrics.get(name)) for name in sorted(asked) if name in metrics]  # a family's member too


# -- quality ----------------------------------------------------------------------------


def reference_data(prompts: list[PromptItem]) -> CellData | None:
    """The reference row's data: the prompt set's references as texts (no references of their own)."""
    refs = [p.reference for p in prompts if p.reference]
    return cell_data({"text": r} for r in refs) if refs else None


# -- the summary ------------------------------------------------------------------------


def _order(data: SweepData, results: list[JobResult | JobInfo]) -> tuple:
    """Sort cells in plan order, else as the spec lists models and strategies."""
    cell = results[0].job.cell
    if cell in data.cell_order:
        return (data.cell_order.index(cell),)
    spec = data.sweep_spec
    models = []
    for m in spec.get("models") or []:
        with contextlib.suppress(ValidationError):  # an unexpected spec shape only changes the order
            models.append(ModelSpec.model_validate(m).label)
    strategies = [s.get("name") for s in spec.get("strategies") or [] if isinstance(s, dict)]
    job = results[0].job
    rank = lambda items, x: items.index(x) if x in items else len(items)
    return (
        len(data.cell_order),
        rank(models, job.model.label),
        job.model.label,
        rank(strategies, job.strategy.name),
        job.strategy.name,
        params_json(job.strategy.params),
    )


def _tasks(data: SweepData, store_url: str | None, settings: Settings) -> list[CellTask]:
    """One task per (model, strategy variant) cell, in plan order: its ids, speed, jobs and records."""
    prompt_rank = {p.id: i for i, p in enumerate(data.prompts)}
    by_cell: dict[str, list[JobResult | JobInfo]] = defaultdict(list)
    for r in data.results:
        by_cell[r.job.cell].append(r)
    records_by_cell: dict[str, list[GenerationRecord]] | None = None
    if data.loaded:
        records_by_cell = defaultdict(list)
        for g in data.generations:
            records_by_cell[g.cell].append(g)
    tasks = []
    for cell in sorted(by_cell, key=lambda c: _order(data, by_cell[c])):
        results = by_cell[cell]
        job = results[0].job
        row: dict[str, Any] = {
            "model": job.model.label,
            "strategy": job.strategy.name,
            "params": params_json(job.strategy.params),
            "n_seeds": len({r.job.seed for r in results}),
            **speed_columns(results),
            **speed_ranges(results),  # tokens/s's interval: the map's (speed.rate_interval of the task's units)
            "n_jobs": len(results),
            "cell": cell,
            **engine_row(job, results),
            **({"samples": job.strategy.samples, "best_of": job.strategy.best_of} if job.strategy.samples else {}),
        }
        records = records_by_cell.get(cell, []) if records_by_cell is not None else None
        where = (store_url, data.tenant, data.sweep_id) if store_url else None
        jobs = [(r.job.job_id, r.generations_sha256) for r in results]  # a task holds no JobResult
        tasks.append(CellTask(cell, row, jobs, prompt_rank, records, where, batch_units(results)))
    return tasks


def _reference_row(data: SweepData, selected, settings: Settings) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The prompt set's own references scored as a row, where it has references; and its interval methods."""
    refs = reference_data(data.prompts)
    if refs is None:
        return None, {}
    row = {
        "model": None,
        "strategy": REFERENCE,
        "params": params_json({}),
        "n_prompts": len(refs.texts),
        "n_generations": len(refs.texts),
        "n_seeds": None,
        "n_jobs": None,
        "cell": REFERENCE,
    }
    groups = [[i] for i in range(len(refs.texts))]
    methods, _ = score(selected, settings, row, refs, groups, REFERENCE, reference_row=True)
    return row, methods


def cell_tasks(
    data: SweepData, n_boot: int, seed: int, n_boot_corpus: int, metrics: MetricSource, store: Store | None
) -> tuple[list[tuple[str, Metric]], Settings, list[CellTask]]:
    """The metrics, the settings and one task per cell, as `summarize` maps them (and as the
    submission server enqueues them for the report workers: the same digests on both sides)."""
    selected = requested_metrics(data, metrics)
    with_ci = enough_prompts(data.results) and n_boot > 0
    names = tuple(name for name, _ in selected)
    task = task_section(data.sweep_spec.get("task"))  # the spec's task: section, checked
    settings = Settings(names, with_ci, n_boot, n_boot_corpus, seed, smallest_cell(data.results), task)
    store_url = getattr(store, "url", None) if store is not None else None
    return selected, settings, _tasks(data, store_url, settings)


def summarize(
    data: SweepData,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    n_boot_corpus: int = 100,
    metrics: MetricSource = METRICS,
    baseline: str | None = None,
    workers: int = 1,
    store: Store | None = None,
    remote=None,
    progress: Tick | None = None,
) -> pd.DataFrame:
    """One row per (model, strategy variant) cell, plus the `reference` row; see the module doc.

    `n_boot`: studentised bootstrap replicates of the metrics with a bootstrap interval (additive
    ones); the plain corpus metrics take the delete-one-prompt jackknife (no replicates);
    `n_boot_corpus` (at most n_boot): replicates of a metric that declares "half-sample".
    `metrics`: the metrics to compute, a registry or a name -> Metric mapping (default: all).
    `baseline`: the cell every cell is compared with (controller.report.stats.paired): a strategy
    name (per model) or a cell key; default the first cell of each model. Comparisons, like
    intervals, need MIN_CI_PROMPTS prompts in every cell (one seed is enough). `workers`: cells
    aggregated in a process pool of that many (0: one per CPU; 1: in this process); `store`: where
    each cell's output is cached (and, for a sweep loaded without its generations, where each cell
    reads its own) — controller.report.compute.cells;
    `remote` (controller.report.distribute.remote.ReportWorkers): the cells, then the pairs, missing from
    the cache computed by the cluster's report workers (the runner's backends: controller.report.compute.runner);
    `progress(what, done, total)`: called as the cells, then the pairs, are done (the CLI's bar).
    """
    runner = Runner(workers, remote, progress)
    cells = _cells(data, (n_boot, seed, n_boot_corpus), metrics, store, runner, baseline)
    selected, settings, tasks, jobs, outputs, cache = cells
    names = settings.names
    data.examples = {(o.row["cell"], pid): ex for o in outputs for pid, ex in o.examples.items()}
    for line in (line for o in outputs for line in o.damaged):  # found while streaming a cell's generations
        structlog.get_logger("decodebench.report").warning(f"{line}; job left out of the report")
        data.damaged.append(line)
    rows = [o.row for o in outputs]
    _agreement(rows, tasks)
    methods: dict[str, set[str]] = defaultdict(set)
    for o in outputs:
        for name, method in o.methods.items():
            methods[name].add(method)
    if settings.with_ci:
        compared = compare(outputs, jobs, settings, baseline, cache, runner)
        for row in rows:
            row.update(compared.get(row["cell"], {}))
    reference, ref_methods = _reference_row(data, selected, settings)
    if reference is not None:
        rows.append(reference)
        for name, method in ref_methods.items():
            methods[name].add(method)
    frame = _frame(rows, list(names), settings.with_ci, has_engines(rows))
    calibrated = {n: m.calibrated_prompts for n, m in selected if n in methods and m.calibrated_prompts}
    frame.attrs.update(_attrs(frame, settings, methods, baseline, fewest_prompts(data.results), calibrated))
    return frame


def _cells(data: SweepData, boot: tuple[int, int, int], metrics, store, runner: Runner, baseline: str | None) -> tuple:
    """`cell_tasks` and every cell's output (from the cache where `store` has it): (selected, settings, tasks,
    jobs, outputs, cache). `boot`: (n_boot, seed, n_boot_corpus). `baseline` and `n_boot` are checked first,
    before any cell is computed."""
    n_boot, seed, n_boot_corpus = boot
    selected, settings, tasks = cell_tasks(data, n_boot, seed, n_boot_corpus, metrics, store)
    check_options(n_boot, baseline, [(t.cell, str(t.row.get("strategy"))) for t in tasks])
    cache = ReportCache(store, data.tenant, data.sweep_id) if store is not None else None
    registry = all(n in METRICS and METRICS.get(n) is m for n, m in selected)  # else: run here, not by name
    jobs = [cell_job(t, settings, None if registry else tuple(selected), cache is not None) for t in tasks]
    return selected, settings, tasks, jobs, cell_outputs(jobs, cache, runner), cache


def cell_statistics(
    data: SweepData, *, n_boot: int = 1000, seed: int = 0, n_boot_corpus: int = 100, store: Store | None = None
) -> tuple[list[tuple[str, Metric]], dict[str, CellStats | CellRef]]:
    """The sweep's metrics and each cell's statistics for paired comparisons (`pairs.held`), as `summarize` with
    the same arguments computes them: read back from the report cache where it ran with `store`. No cell's without
    intervals (fewer than MIN_CI_PROMPTS prompts, or `n_boot` 0)."""
    boot = (n_boot, seed, n_boot_corpus)
    selected, settings, _, jobs, outputs, cache = _cells(data, boot, METRICS, store, Runner(), None)
    return selected, held(outputs, jobs, cache) if settings.with_ci else {}


def _attrs(
    frame: pd.DataFrame,
    settings: Settings,
    methods: dict[str, set[str]],
    baseline: str | None,
    prompts: int,
    calibrated: dict[str, int],
) -> dict:
    """The summary's settings: its intervals (`ci`; `prompts`, those of the smallest cell; `calibrated`, the metrics
    whose intervals were calibrated at more prompts than the house's, and at how many) and MAUVE's equal sample
    (`mauve`)."""
    ci = {
        "level": CI_LEVEL,
        "unit": "prompt",
        "prompts": prompts,
        "calibrated": dict(sorted(calibrated.items())),
        "n_boot": settings.n_boot,
        "n_boot_corpus": min(settings.n_boot, settings.n_boot_corpus),
        "seed": settings.seed,
        "methods": {name: "/".join(sorted(m)) for name, m in methods.items()},
        "baseline": baseline,
        "comparisons": "paired over prompts; bootstrap-t and permutation p (additive), jackknife (plain); Holm",
    }
    mauve = {"n": settings.sample_size, "seed": settings.seed, "draw": "numpy default_rng(crc32('<seed>:<cell>'))"}
    return {
        "ci": ci if settings.with_ci else None,
        "no_ci": None if settings.with_ci else no_interval_note(prompts, settings.n_boot),
        "mauve": mauve if "mauve" in frame.columns and frame["mauve"].notna().any() else None,
    }


def no_interval_note(prompts: int, n_boot: int) -> str:
    """Why a summary has no intervals and no comparisons: what its Markdown, HTML and terminal say instead."""
    if prompts < MIN_CI_PROMPTS:
        plural = "s" if prompts != 1 else ""
        why = f"the smallest cell has {prompts} prompt{plural}, fewer than the {MIN_CI_PROMPTS} they need"
    else:
        why = "the report ran with --n-boot 0"
    return f'No intervals and no paired comparisons: {why} (docs/reports.md, "Confidence intervals").'


def _agreement(rows: list[dict[str, Any]], tasks: list[CellTask]) -> None:
    """Greedy token agreement across engines, where a sweep ran another engine: the records of just those cells."""
    if has_engines(rows):
        needed = agreement_cells(rows)
        add_agreement(rows, {t.cell: cell_records(t)[0] for t in tasks if t.cell in needed})


def _frame(rows: list[dict], metric_names: list[str], with_ci: bool, engines: bool = False) -> pd.DataFrame:
    extra_metrics = [m for m in metric_names if m not in DESIGN_COLUMNS]
    columns = (
        DESIGN_COLUMNS
        + extra_metrics
        + (MAUVE_COLUMNS if "mauve" in metric_names else [])
        + EXTRA_SPEED_COLUMNS
        + SPREAD_COLUMNS
    )
    if engines:  # only where another engine ran: every other report keeps its columns
        columns = columns[:3] + [ENGINE_COLUMN] + columns[3:] + TRAILING
    if has_decode_steps(rows):  # likewise only where a cell ran the static step or CUDA graphs
        columns = columns + [DECODE_STEP_COLUMN]
    if any(row.get("samples") for row in rows):  # likewise only where a cell has samples
        columns = columns[:3] + SAMPLES_COLUMNS + columns[3:]
    if with_ci:
        columns += [f"{m}_ci_{side}" for m in QUALITY_COLUMNS + extra_metrics for side in ("low", "high")]
        columns += comparison_columns(QUALITY_COLUMNS + extra_metrics)
    frame = pd.DataFrame(rows).reindex(columns=columns)
    for col in columns:
        if col in COUNT_COLUMNS or col == "samples":
            frame[col] = frame[col].astype("Int64")
        elif col not in (
            "model",
            "strategy",
            "params",
            "memory_kind",
            "cell",
            "baseline",
            FIRSTS_COLUMN,
            ENGINE_COLUMN,
            DECODE_STEP_COLUMN,
            "best_of",
        ):
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
        else:
            frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
    return frame.copy()  # one block per dtype: a column the reader adds (a notebook's label) warns of no fragments
