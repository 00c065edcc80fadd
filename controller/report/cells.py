"""Per-cell aggregation as a map: one task per cell, run in-process or in a process pool, cached per cell.

`summarize` (controller.report.aggregate) is the reduce: it builds a `CellTask` per cell (its
jobs' ids and hashes, its row so far, and its records or where to read them), runs them through `map_cells`,
and assembles the rows, the paired comparisons and the reference row. A task reads its own
cell's generations from the store when the sweep was loaded without them, so the controller
never holds every record: memory is bounded by a cell per process.

Each output is cached in the store under the sweep's `report/cache/` by a digest of what it
depends on (the cell's jobs and their generations' SHA-256, the metrics and interval settings,
the code's CACHE_VERSION): a report after a retry recomputes only the cells whose jobs changed.
`remote` hands the cells missing from the cache to the report workers of the cluster
(controller.report.remote); whatever they do not deliver is computed here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from controller.metrics import METRICS, CellData, Metric, cell_data
from controller.metrics.divergence import sizes as mauve_sizes
from controller.report.intervals import cell_rng, confidence_intervals, evaluate, prompt_groups
from controller.report.paired import CellStats
from controller.report.speed import rate_interval
from worker.core import paths
from worker.core.errors import CorruptRecordError
from worker.core.results import GenerationRecord

Tick = Callable[[str, int, int], None]  # progress(what, done, total): "results", "cells", "pairs"
MAX_N_BOOT = 100_000  # replicates a report job (a cell's, a pair's) may ask for
DIGEST = re.compile(r"[0-9a-f]{32}")  # a cell's or a pair's cache digest
# bump when a change alters any cell's numbers (2: the jackknife's Student-t floor; 3: tokens/s's interval
# computed by the map, from the task's batch units; 4: paired intervals of additive metrics with the t floor and
# a per-replicate gradient; 5: BLEU's interval no longer [θ, θ], no t from a replicate without spread, shares
# clipped to [0, 1]; 6: a share whose generations are all alike gets the exact binomial interval)
CACHE_VERSION = "6"
MAUVE_COLUMNS = ["mauve_n", "mauve_n_references", "mauve_clusters"]
EXAMPLE_PROMPTS = 3


@dataclass
class Settings:
    """What every cell's numbers depend on besides its data."""

    names: tuple[str, ...]  # the metrics, by name
    with_ci: bool
    n_boot: int
    n_boot_corpus: int
    seed: int
    sample_size: int | None  # MAUVE's equal sample (the smallest cell)
    task: dict | None = None  # the sweep's `task:` section (controller.metrics.extract); None: the default


@dataclass
class CellTask:
    """One cell to aggregate: its row so far (ids, speed), its jobs, and its records or where they are."""

    cell: str
    row: dict[str, Any]
    jobs: list[tuple[str, str | None]]  # (job id, its generations' SHA-256) of each complete job: no JobResult
    prompt_rank: dict[str, int]
    records: list[GenerationRecord] | None = None  # None: read them from the store
    where: tuple[str, str, str] | None = None  # (store URL, tenant, sweep id)
    units: list[list[float]] | None = None  # [new tokens, seconds] of its timed batches (speed.batch_units)


@dataclass
class CellOutput:
    row: dict[str, Any]
    stats: CellStats | None = None
    methods: dict[str, str] = field(default_factory=dict)
    examples: dict[str, dict[str, Any]] = field(default_factory=dict)  # prompt id -> its lowest-seed generation
    damaged: list[str] = field(default_factory=list)
    digest: str | None = None  # its cache key, where it has one
    spilled: bool = False  # its per-prompt statistics dropped here, read again from the cache (`spill`)


def score(
    selected: Sequence[tuple[str, Metric]],
    settings: Settings,
    row: dict,
    cell: CellData,
    groups: list[list[int]],
    key: str,
    *,
    reference_row: bool = False,
    prompts: Sequence[str] = (),
) -> tuple[dict[str, str], CellStats | None]:
    """Fill `row` with the metrics and their intervals; return the methods used and the paired statistics."""
    known: dict = {}  # the additive metrics' statistics, computed once for value and interval
    row.update(evaluate(list(selected), cell, reference_row=reference_row, stats=known))
    if not settings.with_ci:
        return {}, None
    kept: dict = {}
    cis = confidence_intervals(
        list(selected),
        cell,
        row,
        groups,
        n_boot=settings.n_boot,
        n_boot_corpus=settings.n_boot_corpus,
        rng=cell_rng(settings.seed, key),
        reference_row=reference_row,
        keep=kept,
        stats=known,
    )
    for name, (lo, hi, _) in cis.items():
        row[f"{name}_ci_low"], row[f"{name}_ci_high"] = lo, hi
    stats = None
    if not reference_row:
        values = {name: row[name] for name, _ in selected}
        stats = CellStats(key, row["model"], row["strategy"], list(prompts), values, kept)
    return {name: method for name, (_, _, method) in cis.items()}, stats


def mauve_seed(seed: int, cell: str) -> int:
    """The seed of a cell's MAUVE subsample (recorded in the summary's attrs)."""
    import zlib

    return zlib.crc32(f"{seed}:{cell}".encode())


def cell_records(task: CellTask) -> tuple[list[GenerationRecord], list[str]]:
    """The records of the cell's complete jobs, each generation once, streamed from the store by job id and
    hash (S3: several reads in flight, report.jobs.read_each) where the task does not hold them; a damaged
    job's generations are named and left out."""
    if task.records is not None:
        return task.records, []
    from controller.report.jobs import generations_reader, read_each
    from worker.store import open_store

    url, tenant, sweep_id = task.where  # type: ignore[misc]
    store = open_store(url)
    read = generations_reader(store, tenant, sweep_id, dict(task.jobs))
    records, damaged, seen = [], [], set()
    for loaded in read_each(read, [job_id for job_id, _ in task.jobs], store.read_concurrency):
        if isinstance(loaded, CorruptRecordError):
            damaged.append(str(loaded))
            continue
        for g in loaded:
            if (g.job_id, g.prompt_id, g.sample) not in seen:  # a prompt's samples are generations of their own
                seen.add((g.job_id, g.prompt_id, g.sample))
                records.append(g)
    return records, damaged


def run_cell(task: CellTask, selected: Sequence[tuple[str, Metric]], settings: Settings) -> CellOutput:
    """The map: one cell's row (counts, quality, intervals), its paired statistics and its examples."""
    loaded, damaged = cell_records(task)
    rank = task.prompt_rank
    records = sorted(loaded, key=lambda g: (rank.get(g.prompt_id, len(rank)), g.prompt_id, g.job_seed, g.sample))
    row = dict(task.row)
    if task.units is not None:  # the bootstrap of tokens/s over batches, here in the map, not on the controller
        row |= rate_interval(task.units, task.cell, n_boot=settings.n_boot, seed=settings.seed)
    row["n_prompts"] = len({g.prompt_id for g in records})
    row["n_generations"] = len(records)
    prompt_ids = [g.prompt_id for g in records]
    data = cell_data(records)
    data.sample_size, data.sample_seed = settings.sample_size, mauve_seed(settings.seed, task.cell)
    data.task = settings.task
    groups = prompt_groups(prompt_ids)
    methods, stats = score(selected, settings, row, data, groups, task.cell, prompts=list(dict.fromkeys(prompt_ids)))
    if not math.isnan(row.get("mauve", math.nan)):
        row.update(zip(MAUVE_COLUMNS, mauve_sizes(data) or ()))
    examples: dict[str, dict[str, Any]] = {}
    for g in records:  # sorted by prompt, then seed: the first record of a prompt has its lowest seed
        if g.prompt_id not in examples and len(examples) < EXAMPLE_PROMPTS:
            examples[g.prompt_id] = {k: getattr(g, k) for k in ("text", "job_seed", "n_new_tokens", "stop_reason")}
    return CellOutput(row, stats, methods, examples, damaged)


# -- the pool and the cache --------------------------------------------------------------


def _pool_task(args: tuple[CellTask, Settings]) -> CellOutput:
    """What a pool process runs: the metrics are looked up by name in the global registry."""
    task, settings = args
    return run_cell(task, [(n, METRICS.get(n)) for n in settings.names], settings)


def digest(task: CellTask, settings: Settings) -> str | None:
    """The cache key of a cell's output; None where a job has no generations hash (not cacheable)."""
    jobs = sorted(task.jobs)
    if any(sha is None for _, sha in jobs):
        return None
    used = settings.__dict__ | {"sample_size": settings.sample_size if "mauve" in settings.names else None}
    if used["task"] is None:  # the digests of sweeps without a task stay as they were
        del used["task"]
    doc = {"v": CACHE_VERSION, "cell": task.cell, "jobs": jobs, "row": task.row, "rank": task.prompt_rank,
           "units": task.units, "settings": used}  # fmt: skip
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value.item() if hasattr(value, "item") else value


def _nested(values: Any) -> Any:
    return [_nested(v) for v in values] if isinstance(values, list) else plain(values)


def to_json(out: CellOutput) -> dict:
    stats = None
    if out.stats is not None:
        s = out.stats
        stats = {"cell": s.cell, "model": s.model, "strategy": s.strategy, "prompts": s.prompts,
                 "values": {k: plain(v) for k, v in s.values.items()},
                 "kept": {k: [kind, _nested(arr.tolist())] for k, (kind, arr) in s.kept.items()}}  # fmt: skip
    return {"row": {k: plain(v) for k, v in out.row.items()}, "stats": stats, "methods": out.methods,
            "examples": out.examples, "damaged": out.damaged}  # fmt: skip


def from_json(doc: dict) -> CellOutput:
    import numpy as np

    stats = None
    if doc.get("stats"):
        s = doc["stats"]
        kept = {k: (kind, np.array(v, dtype=float)) for k, (kind, v) in s["kept"].items()}
        values = {k: math.nan if v is None else float(v) for k, v in s["values"].items()}
        stats = CellStats(s["cell"], s["model"], s["strategy"], s["prompts"], values, kept)
    return CellOutput(doc["row"], stats, doc.get("methods", {}), doc.get("examples", {}), doc.get("damaged", []))


def from_cache(store, key: str | None) -> CellOutput | None:
    """The cached output under `key`, None where there is none (or it is damaged: recomputed)."""
    if key is None or not store.exists(key):
        return None
    try:
        return from_json(store.read_json(key))
    except (CorruptRecordError, KeyError, TypeError, ValueError):
        return None


def cache_key(tenant: str, sweep_id: str, cell_digest: str) -> str:
    """Where a cell's output is cached in the store."""
    return paths.report_key(tenant, sweep_id, f"cache/{cell_digest}.json")


def spill(out: CellOutput, key: str | None) -> CellOutput:
    """What the reduce keeps of a cell's output once it is in the cache under `key`: the row, methods,
    examples and the statistics' values, not their per-prompt arrays (the bulk of an output, growing
    with the prompts), which a comparison reads again from the cache (controller.report.paircache)."""
    out.digest = key
    if key is not None and out.stats is not None and not out.damaged:
        s = out.stats
        out.stats, out.spilled = CellStats(s.cell, s.model, s.strategy, [], s.values, {}), True
    return out


def map_cells(
    tasks: list[CellTask], selected, settings: Settings, *, workers: int = 1, store=None, remote=None,
    progress: Tick | None = None,
) -> list[CellOutput]:  # fmt: skip
    """Every task's output, in order: from the cache where it holds the cell, else computed and cached.

    `workers` > 1 runs the computations in a process pool (only with the global registry's metrics:
    a pool process finds them by name); `store` (with a task's `where`) holds the cache. `remote`,
    a callable given the (task, digest) pairs missing from the cache, the settings and `on_ready(n)`, has them
    computed elsewhere (controller.report.remote: the report workers, global registry's metrics
    only) and returns once their outputs are in the cache or given up on; what is still missing
    then is computed here. Each output is cached and `spill`ed as it arrives, so the outputs held
    grow by a row per cell, not by a cell's per-prompt statistics. `progress("cells", done, total)`
    is called as outputs arrive."""
    tick = progress or (lambda what, done, total: None)
    outputs: list[CellOutput | None] = [None] * len(tasks)
    keys: list[str | None] = [None] * len(tasks)
    digests: list[str | None] = [None] * len(tasks)
    for i, task in enumerate(tasks):
        d = digest(task, settings) if store is not None and task.where is not None else None
        if d is not None:
            digests[i], keys[i] = d, cache_key(task.where[1], task.where[2], d)  # type: ignore[index]
            if (cached := from_cache(store, keys[i])) is not None:
                outputs[i] = spill(cached, keys[i])
    todo = [i for i, out in enumerate(outputs) if out is None]
    tick("cells", len(tasks) - len(todo), len(tasks))
    global_registry = all(METRICS.get(n) is m for n, m in selected if n in METRICS) and all(
        n in METRICS for n, _ in selected
    )
    if remote is not None and global_registry and todo:  # a report worker knows only the global registry
        had = len(tasks) - len(todo)  # the report workers' outputs move the progress as they come
        on_ready = lambda ready: tick("cells", had + ready, len(tasks))
        remote([(tasks[i], digests[i]) for i in todo if digests[i] is not None], settings, on_ready)
        for i in todo:
            if (cached := from_cache(store, keys[i])) is not None:
                outputs[i] = spill(cached, keys[i])
        todo = [i for i in todo if outputs[i] is None]
        tick("cells", len(tasks) - len(todo), len(tasks))
    finished = [len(tasks) - len(todo)]

    def done(i: int, out: CellOutput) -> None:
        if keys[i] is not None and not out.damaged:
            store.write_json(keys[i], to_json(out))
        outputs[i] = spill(out, keys[i])
        finished[0] += 1
        tick("cells", finished[0], len(tasks))

    if workers != 1 and global_registry and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=workers if workers > 0 else os.cpu_count()) as pool:
            for i, out in zip(todo, pool.map(_pool_task, [(tasks[i], settings) for i in todo], chunksize=1)):
                done(i, out)
    else:
        for i in todo:
            done(i, run_cell(tasks[i], selected, settings))
    return outputs  # type: ignore[return-value]  # each `spill`ed: its digest set, its statistics kept where uncached
