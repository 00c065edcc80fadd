"""What a report keeps of each complete job when the sweep is loaded without its generations.

A loaded JobResult costs ~17 KB of memory (2.5 KB of JSON), over half of it its JobSpec's prompts,
which every cell repeats; a sweep of 190k jobs held that way needs ~3 GB on the controller (and on
the submission server, which plans report jobs from the same load). A `JobInfo` keeps only what the
report reads of a result, under the same attribute names (so the speed columns, the engine columns
and the provenance table read either): the job's ids, seed and shard, its generations' SHA-256, its
batches' timings (per-request ones packed, 8 bytes a number), the memory readings the speed columns
use, the distribution check's p-value and its provenance. What the jobs of a sweep repeat (model,
strategy, engine, metrics, a shard's prompts, the provenance but its seed) is held once and shared.
A cell's map needs only its jobs' ids and hashes (cells.CellTask.jobs): it streams their generations
from the store.
"""

from __future__ import annotations

import json
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from controller.report.stats.speed import MEMORY_KEYS
from worker.core.contract import EngineSpec, ModelSpec, PromptItem, StrategySpec
from worker.core.errors import CorruptRecordError, UsageError, short, shown
from worker.core.results import BatchTiming, JobResult, model_hashes, plugin_of

READ_WINDOW = 512  # reads handed to the threads at a time: what is held before the reader takes it


def read_each(read: Callable[[str], Any], keys: Iterable[str], threads: int) -> Iterator[Any]:
    """`read(key)` of every key, in order, `threads` at once (a store's `read_concurrency`: S3's round
    trips overlap; a local disk reads one at a time), a window of READ_WINDOW keys at a time (so a
    sweep of 190k jobs is never all in flight, nor all held). `read` catches what it expects; anything
    else it raises is raised here, as a serial loop would."""
    keys = list(keys)
    if threads <= 1 or len(keys) <= 1:
        yield from map(read, keys)
        return
    pool = ThreadPoolExecutor(max_workers=min(threads, len(keys)), thread_name_prefix="store-read")
    try:
        for start in range(0, len(keys), READ_WINDOW):
            yield from pool.map(read, keys[start : start + READ_WINDOW])
    finally:  # a reader that stops early (or a read that raised) does not wait for the window's other reads
        pool.shutdown(wait=True, cancel_futures=True)


def job_reader(store, tenant: str, sweep_id: str, with_generations: bool) -> Callable[[str], Any]:
    """`read(job_id)`: the job's (result, its generations or []), or the CorruptRecordError naming what
    is damaged (a worker killed mid-write, a hand edit): the report leaves that job out, as if missing."""

    def read(job_id: str) -> tuple[JobResult, list] | CorruptRecordError:
        try:
            result = store.load_result(tenant, sweep_id, job_id)
            sha = result.generations_sha256
            return result, store.load_generations(tenant, sweep_id, job_id, sha) if with_generations else []
        except CorruptRecordError as err:
            return err

    return read


def check_model_files(results: Iterable[JobResult | JobInfo]) -> None:
    """A UsageError naming the first model whose complete jobs recorded different content hashes of its files (they
    changed at the same path between runs of the sweep, or differ between workers): its cells would mix two models
    under one name. Every model a job loads counts (its own, the scorer, the featurizer, an assisted strategy's
    draft); jobs that recorded none (a hub id) are not compared."""
    hashes: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))  # path -> hash -> job ids
    labels: dict[str, str] = {}
    for r in results:
        for path, (label, digest) in model_hashes(r.provenance).items():
            hashes[path][digest].append(r.job.job_id)
            labels.setdefault(path, label)
    if mixed := _first_mixed(hashes, lambda h: h[:12]):
        path, seen = mixed
        raise UsageError(
            f"model {short(labels[path])} ({shown(path)}): the sweep's complete jobs of it ran on different "
            f"files (content hash {seen}), so its cells would mix two models; delete the result.json of the jobs "
            "of the files you do not want and run the sweep again with the others, or run it as a new sweep"
        )


def check_plugins(results: Iterable[JobResult | JobInfo]) -> None:
    """A UsageError naming the first plugin strategy whose complete jobs recorded different plugins (another version
    of its distribution installed between runs of the sweep, or on another worker): its cells would mix two versions
    of the strategy under one name. Jobs that recorded none (a built-in, a result from before) are not compared."""
    plugins: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))  # strategy -> plugin -> jobs
    for r in results:
        if (plugin := plugin_of(r.provenance)) is not None:
            plugins[r.job.strategy.name][plugin].append(r.job.job_id)
    if mixed := _first_mixed(plugins, shown):
        name, seen = mixed
        raise UsageError(
            f"strategy {short(name)}: the sweep's complete jobs of it ran different plugins ({seen}), so its cells "
            "would mix two versions of it; delete the result.json of the jobs of the version you do not want and "
            "run the sweep again with the other, or run it as a new sweep"
        )


def _first_mixed(recorded: Mapping[str, Mapping[str, list[str]]], show: Callable[[str], str]) -> tuple[str, str] | None:
    """The first key whose complete jobs recorded more than one value (key -> value -> job ids), with each value
    `show`n beside its count of jobs and one of them; None where every key has one."""
    for key, by_value in recorded.items():
        if len(by_value) > 1:
            return key, "; ".join(
                f"{show(v)}: {len(ids)} job{'s' * (len(ids) > 1)}, e.g. {ids[0]}" for v, ids in by_value.items()
            )
    return None


def generations_reader(store, tenant: str, sweep_id: str, shas: Mapping[str, str | None]) -> Callable[[str], Any]:
    """`read(job_id)`: the job's generations checked against its hash in `shas` (a cell task's jobs), or the
    CorruptRecordError naming what is damaged: the cell leaves that job out."""

    def read(job_id: str) -> list | CorruptRecordError:
        try:
            return store.load_generations(tenant, sweep_id, job_id, shas[job_id])
        except CorruptRecordError as err:
            return err

    return read


NO_ENGINE: Mapping[str, Any] = MappingProxyType({})  # the engine record of a job with nothing the report reads


@dataclass(slots=True)
class Batch:
    """The fields of a BatchTiming that the speed columns read."""

    n: int
    new_tokens: int
    prefill_s: float
    total_s: float
    decode_s: float
    steps: int | None
    energy_j: float | None
    latency_s: Sequence[float] | None  # an array("d") (jobs._floats)
    ttft_s: Sequence[float] | None
    tpot_s: Sequence[float | None] | None


@dataclass(slots=True)
class JobView:
    """The fields of a JobSpec that the report reads; model, strategy, engine, metrics and prompts shared."""

    tenant: str
    job_id: str
    cell: str
    seed: int
    shard: int
    model: ModelSpec
    strategy: StrategySpec
    engine: EngineSpec | None
    metrics: tuple[str, ...]
    prompts: list[PromptItem]


@dataclass(slots=True)
class JobInfo:
    """A complete job as the report keeps it (see the module doc); `provenance` is without the seed."""

    job: JobView
    generations_sha256: str | None
    batches: list[Batch]
    memory: dict[str, float]
    engine: Mapping[str, Any]
    provenance: Mapping[str, Any]


def _floats(values: list | None) -> Sequence | None:
    """A batch's per-request timings, 8 bytes a number (a list holds a 32-byte float object each); a
    list with a None (a request with no decode step's time) kept as it is."""
    if values is None or any(v is None for v in values):
        return values
    return array("d", values)


def batch(b: BatchTiming) -> Batch:
    return Batch(
        b.n,
        b.new_tokens,
        b.prefill_s,
        b.total_s,
        b.decode_s,
        b.steps,
        b.energy_j,
        _floats(b.latency_s),
        _floats(b.ttft_s),
        _floats(b.tpot_s),
    )


def _engine(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the report reads of result.json's `engine`: the distribution check's p-value, and the decode step
    where it was not the eager one (the summary's `decode_step` column)."""
    check = record.get("distribution_check") or {}
    step = (record.get("decode_step") or {}).get("mode")
    found: dict[str, Any] = {"distribution_check": {"p_value": check["p_value"]}} if "p_value" in check else {}
    if step not in (None, "eager"):
        found["decode_step"] = step
    return found or NO_ENGINE


class Compactor:
    """Turns JobResults into JobInfos, one object for each distinct shared part over all the jobs it sees."""

    def __init__(self) -> None:
        self._shared: dict[tuple, Any] = {}

    def _once(self, kind: str, key: Any, value: Any) -> Any:
        return self._shared.setdefault((kind, key), value)

    def __call__(self, r: JobResult) -> JobInfo:
        j = r.job
        prompts = self._once("prompts", tuple((p.id, p.prompt, p.reference) for p in j.prompts), j.prompts)
        job = JobView(
            self._once("text", j.tenant, j.tenant),
            j.job_id,
            self._once("text", j.cell, j.cell),
            j.seed,
            j.shard,
            self._once("model", j.model.model_dump_json(), j.model),
            self._once("strategy", j.strategy.model_dump_json(), j.strategy),
            None if j.engine is None else self._once("engine", j.engine.model_dump_json(), j.engine),
            self._once("metrics", tuple(j.metrics), tuple(j.metrics)),
            prompts,
        )
        engine = _engine(r.engine or {})
        provenance = {k: v for k, v in r.provenance.items() if k != "seed"}
        provenance = self._once("provenance", json.dumps(provenance, sort_keys=True, default=str), provenance)
        memory = {k: v for k in MEMORY_KEYS if (v := r.memory.get(k)) is not None}
        return JobInfo(job, r.generations_sha256, [batch(b) for b in r.batches], memory, engine, provenance)


def prompts_of(results: list[JobResult] | list[JobInfo]) -> list[PromptItem]:
    """The prompts of the jobs, each once, in shard order."""
    seen: dict[str, PromptItem] = {}
    for r in sorted(results, key=lambda r: r.job.shard):
        for p in r.job.prompts:
            seen.setdefault(p.id, p)
    return list(seen.values())


# The fewest prompts a cell needs for intervals and paired comparisons. The prompt is the resampling unit
# (a sweep's seeds nest within it), so one generation per prompt is enough; below 8 prompts a bootstrap over
# prompts has too few distinct resamples to mean anything (docs/reports.md, "Intervals").
MIN_CI_PROMPTS = 8
# The fewest prompts at which the house's intervals were measured to cover 93-97% on both of the benchmarks'
# generative processes (docs/reports.md, "Calibrated sizes"). Below it a metric that a few prompts dominate can
# cover less: rep_2 88.6-92.0% at 16 prompts where one prompt in a few loops. The report says so. A metric measured
# to need more declares it (`Metric.calibrated_prompts`: distinct-3, 64).
CALIBRATED_PROMPTS = 32


def fewest_prompts(results: Sequence[JobResult | JobInfo]) -> int:
    """The prompts of the sweep's smallest cell (its complete jobs'), whatever the seeds; 0 without a cell."""
    per_cell: dict[str, set[str]] = defaultdict(set)
    for r in results:
        per_cell[r.job.cell].update(p.id for p in r.job.prompts)
    return min((len(ids) for ids in per_cell.values()), default=0)


def enough_prompts(results: Sequence[JobResult | JobInfo]) -> bool:
    """Whether every cell has at least MIN_CI_PROMPTS prompts (its complete jobs'), whatever the seeds."""
    return fewest_prompts(results) >= MIN_CI_PROMPTS


def smallest_cell(results: Sequence[JobResult | JobInfo]) -> int | None:
    """The generations of the sweep's smallest cell (from its jobs' prompts): MAUVE compares every cell on that many."""
    per_cell: dict[str, int] = defaultdict(int)
    for r in results:
        per_cell[r.job.cell] += len(r.job.prompts)
    return min(per_cell.values(), default=None)
