"""A (cell, baseline) pair's paired comparison as a report task, cached beside its cells' outputs.

The pair's entry is `pair-<digest>` (the digest: both cells' cache keys and the comparison's
settings, `pair_name`). The reduce holds each cached cell's output spilled (controller.report.
compute.cells: its per-prompt statistics are in the cache only, so the controller's memory grows by
a row per cell, not by a cell's prompts), so a pair refers to such a cell by where its entry is
(`CellRef`) and reads its whole statistics when it runs: here, in a pool process, or in a report
worker (which reads them from its own store). A model's baseline is compared with each of its
cells, so the last few cells read are kept (`KEPT`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import structlog

from controller.metrics import METRICS, Metric
from controller.report.compute.cache import ReportCache
from controller.report.compute.celljob import CellJob
from controller.report.compute.cells import CACHE_VERSION, CellOutput, Settings, from_json
from controller.report.compute.runner import Runner
from controller.report.compute.tasks import DIGEST, bounded, plain
from controller.report.stats.cellstats import CellStats
from controller.report.stats.intervals import cell_rng
from controller.report.stats.paired import TAIL_COUNT, baselines, compare_pair, with_holm
from controller.sweep.plan import check_baseline
from worker.core.errors import CorruptRecordError, PermanentJobError, UsageError

KEPT = 8  # whole cells' statistics kept read (a model's baseline is read once, not per cell)
MAX_BASELINE = 1024  # characters of a baseline (a strategy name or a cell key)
FIELDS = {"kind", "tenant", "sweep_id", "cell", "base", "pair", "names", "n_boot", "seed", "baseline"}


@functools.lru_cache(maxsize=KEPT)
def read_stats(url: str, key: str) -> CellStats:
    """A cell's whole statistics from its cache entry (keys are digests of what the entry holds: never stale)."""
    from worker.store import open_store

    store = open_store(url)
    try:
        out = from_json(store.read_json(key)) if store.exists(key) else None
    except (CorruptRecordError, KeyError, TypeError, ValueError):
        out = None
    if out is None or out.stats is None:
        raise CorruptRecordError(f"{url.rstrip('/')}/{key}: a compared cell's output left the report cache")
    return out.stats


@dataclass
class CellRef:
    """A spilled cell: where its output is cached, and its job, computed again if the entry left meanwhile."""

    url: str
    key: str
    job: CellJob | None = None

    def stats(self) -> CellStats:
        try:
            return read_stats(self.url, self.key)
        except CorruptRecordError:
            if self.job is None:
                raise
            return self.job.run().stats  # type: ignore[return-value]  # deleting report/cache/ stays safe


Stats = CellStats | CellRef  # a cell's statistics, held or where they are cached


def pair_name(cell_key: str, base_key: str, n_boot: int, seed: int, baseline: str | None) -> str:
    """A pair's cache digest, from both cells' cache keys and the comparison's settings."""
    doc = [CACHE_VERSION, cell_key, base_key, n_boot, seed, baseline]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


@dataclass
class PairJob:
    """A cell compared with its baseline: both cells' statistics (held, or where they are cached) and the settings."""

    kind: ClassVar[str] = "pair"
    prefix: ClassVar[str] = "pair-"
    digest_field: ClassVar[str] = "pair"
    signer_call: ClassVar[str] = "report_pairs"

    names: tuple[str, ...]
    n_boot: int
    seed: int
    baseline: str | None
    cache: ReportCache | None = None  # where both cells' outputs are cached (None: not cacheable)
    digests: tuple[str | None, str | None] = (None, None)  # both cells' entries in it
    a: CellStats | CellRef | None = None  # the cell (None: only planned, by the signer)
    b: CellStats | CellRef | None = None  # its baseline
    metrics: tuple[tuple[str, Metric], ...] | None = None  # None: the global registry's, by name
    n_boot_corpus: int | None = None  # the report's, which the signer plans the cells with (not the pair's)

    @property
    def digest(self) -> str | None:
        if self.cache is None or None in self.digests:
            return None
        keys = [self.cache.key(d) for d in self.digests]  # type: ignore[arg-type]
        return pair_name(*keys, self.n_boot, self.seed, self.baseline)

    @property
    def label(self) -> str | None:
        return self.digest

    @property
    def name(self) -> str | None:
        digest = self.digest
        return None if digest is None else self.prefix + digest

    @property
    def portable(self) -> bool:
        return self.metrics is None

    def run(self) -> dict[str, Any]:
        a, b = (s if isinstance(s, CellStats) else s.stats() for s in (self.a, self.b))  # type: ignore[union-attr]
        metrics = dict(self.metrics) if self.metrics is not None else {n: METRICS.get(n) for n in self.names}
        return compare_pair(a, b, metrics, n_boot=self.n_boot, rng=cell_rng(self.seed, f"{a.cell}|paired"))

    def entry(self, output: dict[str, Any]) -> dict[str, Any]:
        return {k: plain(v) for k, v in output.items()}

    def output(self, entry: dict[str, Any]) -> dict[str, Any]:
        return entry

    def payload(self) -> dict[str, Any]:
        """A pair job's payload: ids and settings only; `cell` and `base` are the two cells' digests."""
        where = {"tenant": self.cache.tenant, "sweep_id": self.cache.sweep_id}  # type: ignore[union-attr]
        cells = {"cell": self.digests[0], "base": self.digests[1], "pair": self.digest}
        settings = {"names": list(self.names), "n_boot": self.n_boot, "seed": self.seed, "baseline": self.baseline}
        return {"kind": self.kind, **where, **cells, **settings}

    def request(self) -> tuple[str, dict[str, Any]] | None:
        if self.baseline is not None and (len(self.baseline) > MAX_BASELINE or not self.baseline.isprintable()):
            structlog.get_logger("decodebench.report").warning(
                f"report: a baseline of over {MAX_BASELINE} characters, or with control characters, is not sent "
                "to the signer; the pairs are computed here"
            )
            return None
        body = {
            "n_boot": self.n_boot,
            "n_boot_corpus": self.n_boot_corpus,
            "seed": self.seed,
            "baseline": self.baseline,
        }
        return self.cache.sweep_id, body  # type: ignore[union-attr]

    @classmethod
    def answered(cls, reply: dict[str, Any]) -> set[str]:
        return {cls.prefix + n for n in reply.get("names") or []}

    @classmethod
    def refusal(cls, doc: dict[str, Any], tenant: str) -> str | None:
        """Why a pair job's payload (tenant and sweep id already checked) must not run, or None."""
        if set(doc) != FIELDS:
            return f"refused: the pair job's fields are not {sorted(FIELDS)}"
        for name in ("cell", "base", "pair"):
            if not isinstance(doc[name], str) or not DIGEST.fullmatch(doc[name]):
                return f"refused: the pair job's {name} is not a cache digest"
        names = doc["names"]
        if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names):
            return "refused: the pair job's metric names are not a list of distinct names"
        unknown = [n for n in names if not isinstance(n, str) or n not in METRICS]
        if unknown:
            return f"refused: unknown metric {str(unknown[0])[:64]!r} in the pair job"
        if why := bounded(doc, ("n_boot", "seed"), "pair job"):
            return why
        base = doc["baseline"]
        if base is not None and (not isinstance(base, str) or len(base) > MAX_BASELINE):
            return f"refused: the pair job's baseline is not a string of at most {MAX_BASELINE} characters"
        if doc["pair"] != cls.of_payload(doc, None).digest:
            return "refused: the pair job's digest is not its cells' and settings'"
        return None

    @classmethod
    def of_payload(cls, doc: dict[str, Any], store) -> PairJob:
        """The pair its payload names, both cells as their cache entries under the payload's tenant and sweep."""
        cache = ReportCache(store, doc["tenant"], doc["sweep_id"])
        a, b = (CellRef(getattr(store, "url", ""), cache.key(doc[k])) for k in ("cell", "base"))
        settled = (tuple(doc["names"]), doc["n_boot"], doc["seed"], doc["baseline"], cache, (doc["cell"], doc["base"]))
        return cls(*settled, a, b)

    @classmethod
    def from_payload(cls, doc: dict[str, Any], store) -> PairJob:
        """The pair in a report worker: both cells' outputs from its own store's cache, held."""
        job = cls.of_payload(doc, store)
        a, b = (job.cache.read(d) for d in job.digests)  # type: ignore[union-attr,arg-type]
        held = [from_json(e).stats if e is not None else None for e in (a, b)]
        if None in held:
            raise PermanentJobError("a cell of the pair is not in the report cache (or has no statistics)")
        job.a, job.b = held  # type: ignore[assignment]
        return job


def pair_jobs(
    outputs: list[CellOutput],
    jobs: Sequence[CellJob],
    settings: Settings,
    baseline: str | None,
    cache: ReportCache | None,
) -> tuple[dict[str, str | None], list[tuple[str, PairJob]]]:
    """Who is compared with whom (cell -> its baseline), and each compared cell's pair job, in the cells' order."""
    base_of = baselines([o.stats for o in outputs if o.stats is not None], baseline)
    by_cell = {o.row["cell"]: o for o in outputs}
    side = held(outputs, jobs, cache)
    metrics = jobs[0].metrics if jobs else None
    made = []
    for cell, base in base_of.items():
        if base is not None:
            digests = (by_cell[cell].cached_as, by_cell[base].cached_as)
            settled = (settings.names, settings.n_boot, settings.seed, baseline, cache, digests)
            made.append((cell, PairJob(*settled, side[cell], side[base], metrics, settings.n_boot_corpus)))
    return base_of, made


def held(outputs: list[CellOutput], jobs: Sequence[CellJob], cache: ReportCache | None) -> dict[str, Stats]:
    """Each cell's statistics for comparisons, by cell key: held, or where its spilled output is cached (read when a
    pair runs). A cell without statistics (no intervals) is left out."""
    job_of = {j.task.cell: j for j in jobs}
    out: dict[str, Stats] = {}
    for o in outputs:
        cell = o.row["cell"]
        if not o.spilled and o.stats is not None:
            out[cell] = o.stats
        elif o.spilled and cache is not None and o.cached_as is not None:
            out[cell] = CellRef(cache.store.url, cache.key(o.cached_as), job_of.get(cell))
    return out


def compare(
    outputs: list[CellOutput],
    jobs: Sequence[CellJob],
    settings: Settings,
    baseline: str | None,
    cache: ReportCache | None,
    runner: Runner,
) -> dict[str, dict[str, Any]]:
    """`summarize`'s comparisons: each cell's with its baseline, through the cache and the runner, Holm
    over the whole table (always afresh)."""
    base_of, made = pair_jobs(outputs, jobs, settings, baseline, cache)
    compared = {made[i][0]: pair for i, pair in runner.run([job for _, job in made], cache, "pairs")}
    read_stats.cache_clear()
    return with_holm(base_of, compared, settings.names)


def check_options(n_boot: int, baseline: str | None, cells: Sequence[tuple[str, str]]) -> None:
    """The report's options, each wrong one a line before any cell is computed. `--n-boot`: 0 (no intervals) or
    enough replicates for a p-value (TAIL_COUNT: below it a p could not go under 1 / (n + 1), 0.25 from 3, for any
    difference). `--baseline` names a cell key or a strategy of the sweep (`check_baseline`). `cells`: each cell's
    (key, strategy name)."""
    if 0 < n_boot < TAIL_COUNT:
        raise UsageError(
            f"--n-boot {n_boot}: too few bootstrap replicates for an interval or a p-value (at least {TAIL_COUNT};"
            " the default is 1000), or 0 for none"
        )
    check_baseline("--baseline", baseline, cells)
