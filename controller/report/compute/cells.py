"""A cell's statistics: its row (counts, quality, intervals), its paired statistics and its examples.

`summarize` (controller.report.compute.aggregate) is the reduce: it builds a `CellTask` per cell
(its jobs' ids and hashes, its row so far, and its records or where to read them), runs them as
report tasks (`CellJob`, controller.report.compute.celljob) through the runner, and assembles the
rows, the paired comparisons and the reference row. A task reads its own cell's generations from
the store when the sweep was loaded without them, so the controller never holds every record:
memory is bounded by a cell per process.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.metrics import CellData, CountItems, Metric, OverlapItems, UnionItems, cell_data
from controller.metrics.divergence import sizes as mauve_sizes
from controller.report.compute.columns import MAUVE_COLUMNS
from controller.report.compute.tasks import plain
from controller.report.stats.cellstats import CellStats
from controller.report.stats.intervals import MAX_KEPT_ITEMS, cell_rng, confidence_intervals, evaluate, prompt_groups
from controller.report.stats.speed import rate_interval
from worker.core.errors import CorruptRecordError
from worker.core.results import GenerationRecord

# bump when a change alters any cell's numbers (2: the jackknife's Student-t floor; 3: tokens/s's interval
# computed by the map, from the task's batch units; 4: paired intervals of additive metrics with the t floor and
# a per-replicate gradient; 5: BLEU's interval no longer [θ, θ], no t from a replicate without spread, shares
# clipped to [0, 1]; 6: a share whose generations are all alike gets the exact binomial interval; 7: a cell's
# bootstrap-t studentised by its replicates' smoothed SE curve, `bootstrap_t.spread_curve`; 8: the jackknife's
# interval Student's t skew-corrected, `intervals.skew_corrected`; 9: self-BLEU's on its own scale, not the logit;
# 10: distinct-n's the adjusted empirical likelihood of its pseudo-values (withdrawn the same day); 11: a [0, 1]
# metric with every prompt at its bound gets the exact interval of nothing seen, `shares.within_scale`; 12:
# distinct-n's the skew-corrected t again; 13: a permutation p in its tail by importance sampling, `paired.tail_p`;
# 14: distinct-n's paired p a permutation test of the metric recomputed on swapped prompts, its items kept; 15:
# an additive metric's swaps per generation where the cells' generations a prompt differ, `swaps.additive`; 16:
# self-BLEU's paired p a permutation test of the metric recomputed on swapped prompts, its n-gram occurrences kept;
# 17: a plain corpus metric's statistics of each prompt's first generation kept, `CellStats.firsts`; Zipf's paired p
# a permutation test of the metric recomputed on swapped prompts, its word counts kept, `swaps.zipf`; 18: a
# per-prompt metric's swaps (pass@k, maj@k: `Metric.per_prompt`) of its prompts as they are, pass@1's the mid-p;
# 19: every interval, and a paired difference's, inside the values its metric can take, `Metric.bounds`; ROUGE a
# unit_interval share; 20: a share of one 0/1 outcome a prompt (pass@k of k samples, maj@k) the exact interval of its
# prompts, `shares.binary_prompts`; 21: a share whose every prompt sits at one value inside (0, 1) the exact
# interval of none seen off it, as at a bound, `shares.within_scale`; 22: exact_match of several answers a prompt
# Korn and Graubard's interval, `shares.korn_graubard`; 23: pass@1 of n samples a prompt exact_match's interval,
# `shares.outcome_counts`; 24: McNemar's mid-p 1 where the discordant prompts split evenly, `paired.mcnemar_p`;
# tokens/s's interval over three batches or fewer Student's t, not their range, `bootstrap_t.from_replicates`; 25:
# an interval narrower than float noise one without width (diversity at 1 was [1, 1]), `shares.within_scale`; 26:
# the word tokenizer keeps combining marks inside their word and splits CJK into characters, `metrics.tokenize`;
# 27: a plain batch's latency, TTFT and TPOT counted once for each of its generations, every sample of a prompt, as
# a stream's, `speed._per_generation`)
CACHE_VERSION = "27"
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
    cached_as: str | None = None  # its entry's name in the report cache (its digest), where it has one
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
    items: dict = {}
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
        keep_items=None if reference_row else items,  # the reference row is compared with nothing
        stats=known,
    )
    for name, (lo, hi, _) in cis.items():
        row[f"{name}_ci_low"], row[f"{name}_ci_high"] = lo, hi
    stats = None
    if not reference_row:
        values = {name: row[name] for name, _ in selected}
        sizes = [len(g) for g in groups]
        stats = CellStats(key, row["model"], row["strategy"], list(prompts), values, kept, items, sizes)
        corpus = [(n, m) for n, m in selected if stats.plain(n)]
        if corpus and any(len(g) > 1 for g in groups):  # `CellStats.firsts`: the corpus metrics of each prompt's
            # first generation (lowest seed and sample), which a comparison with a baseline of other generations a
            # prompt takes (`cellstats.matched`); a cell of one generation a prompt is its own
            first = cell.subset([g[0] for g in groups])
            sub = {"model": row["model"], "strategy": row["strategy"]}
            alone = [[i] for i in range(len(groups))]
            stats.firsts = score(corpus, settings, sub, first, alone, f"{key}|first", prompts=prompts)[1]
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
    from controller.report.load.jobs import generations_reader, read_each
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


def digest(task: CellTask, settings: Settings) -> str | None:
    """A cell's content digest (its cache entry's name); None where a job has no generations hash."""
    jobs = sorted(task.jobs)
    if any(sha is None for _, sha in jobs):
        return None
    used = settings.__dict__ | {"sample_size": settings.sample_size if "mauve" in settings.names else None}
    if used["task"] is None:  # the digests of sweeps without a task stay as they were
        del used["task"]
    doc = {
        "v": CACHE_VERSION,
        "cell": task.cell,
        "jobs": jobs,
        "row": task.row,
        "rank": task.prompt_rank,
        "units": task.units,
        "settings": used,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _nested(values: Any) -> Any:
    return [_nested(v) for v in values] if isinstance(values, list) else plain(values)


def items_to_json(u: UnionItems | OverlapItems | CountItems) -> dict:
    raw = base64.b64encode(u.items.astype("<u8").tobytes()).decode()
    if isinstance(u, CountItems):
        return {"kind": "counts", "sizes": u.sizes.tolist(), "counts": u.counts.tolist(), "items": raw}
    if isinstance(u, OverlapItems):
        return {"kind": "overlap", "sizes": u.sizes.tolist(), "lengths": u.lengths.tolist(), "max_n": u.max_n,
                "items": raw}  # fmt: skip
    return {"sizes": u.sizes.tolist(), "totals": u.totals.tolist(), "items": raw}


def _ints(values: Any) -> np.ndarray:
    """A cached list of integers as int64; ValueError where it is not one (a number past int64 included)."""
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise ValueError("cached swap items: not a cell's")
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        raise ValueError("cached swap items: not a cell's") from None


def items_from_json(doc: dict, groups: int) -> UnionItems | OverlapItems | CountItems:
    """A cached metric's swap items (a union metric's, self-BLEU's n-gram occurrences, Zipf's word counts);
    ValueError where they are not a cell's of `groups` prompts, or too many."""
    raw = base64.b64decode(doc["items"], validate=True)
    if len(raw) % 8 or len(raw) // 8 > MAX_KEPT_ITEMS or len(doc["sizes"]) != groups:
        raise ValueError("cached swap items: not a cell's")
    items = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
    sizes = _ints(doc["sizes"])
    if doc.get("kind", "union") == "union":
        return UnionItems(items, sizes, np.array(doc["totals"], dtype=float))
    if doc["kind"] == "counts":  # CountItems checks the rest: a count per item, each at least 1
        if len(doc["counts"]) != len(items):
            raise ValueError("cached swap items: not a cell's")
        return CountItems(items, _ints(doc["counts"]), sizes)
    if doc["kind"] != "overlap" or type(doc["max_n"]) is not int or not 1 <= doc["max_n"] <= 8:
        raise ValueError("cached swap items: not a cell's")
    lengths = _ints(doc["lengths"])
    if lengths.ndim != 1 or len(lengths) != sizes.sum() or (lengths < 0).any() or lengths.sum() > len(items):
        raise ValueError("cached swap items: not a cell's")  # checked before a (generations, max_n) array is built
    return OverlapItems(items, np.maximum(0, lengths[:, None] - np.arange(doc["max_n"])), sizes)


def to_json(out: CellOutput) -> dict:
    stats = None
    if out.stats is not None:
        s = out.stats
        stats = {
            "cell": s.cell,
            "model": s.model,
            "strategy": s.strategy,
            "prompts": s.prompts,
            "values": {k: plain(v) for k, v in s.values.items()},
            "kept": {k: [kind, _nested(arr.tolist())] for k, (kind, arr) in s.kept.items()},
            "items": {k: items_to_json(u) for k, u in s.items.items()},
            "generations": list(s.generations),
            "firsts": to_json(CellOutput({}, s.firsts))["stats"] if s.firsts is not None else None,
        }
    row = {k: plain(v) for k, v in out.row.items()}
    return {"row": row, "stats": stats, "methods": out.methods, "examples": out.examples, "damaged": out.damaged}


def from_json(doc: dict) -> CellOutput:
    """A cached output; KeyError, TypeError or ValueError where the entry is not one."""
    stats = None
    if doc.get("stats"):
        s = doc["stats"]
        kept = {k: (kind, np.array(v, dtype=float)) for k, (kind, v) in s["kept"].items()}
        values = {k: math.nan if v is None else float(v) for k, v in s["values"].items()}
        items = {k: items_from_json(u, len(s["prompts"])) for k, u in s.get("items", {}).items()}
        generations = [int(k) for k in s.get("generations", [])]
        if generations and (len(generations) != len(s["prompts"]) or min(generations) < 1):
            raise ValueError("cached generations: not one a prompt")
        stats = CellStats(s["cell"], s["model"], s["strategy"], s["prompts"], values, kept, items, generations)
        if (first := s.get("firsts")) is not None:  # one level: a nested entry is refused before it is read
            if not isinstance(first, dict) or first.get("firsts") is not None:
                raise ValueError("cached first generations: not the cell's")
            stats.firsts = from_json({"row": {}, "stats": first}).stats
            if stats.firsts is None or stats.firsts.prompts != stats.prompts or set(stats.firsts.generations) - {1}:
                raise ValueError("cached first generations: not the cell's")
    return CellOutput(doc["row"], stats, doc.get("methods", {}), doc.get("examples", {}), doc.get("damaged", []))


def spill(out: CellOutput, name: str | None) -> CellOutput:
    """What the reduce keeps of a cell's output once it is in the cache as `name`: the row, methods,
    examples and the statistics' values, not their per-prompt arrays (the bulk of an output, growing
    with the prompts), which a comparison reads again from the cache (controller.report.compute.pairs)."""
    out.cached_as = name
    if name is not None and out.stats is not None and not out.damaged:
        s = out.stats
        out.stats, out.spilled = CellStats(s.cell, s.model, s.strategy, [], s.values, {}), True
    return out
