"""The paired comparisons' cache and pool: each (cell, baseline) pair cached beside its cells' outputs.

`summarize` (controller.report.aggregate) hands `paired.compare_cells` a memo (`pair_memo`) and a
loader (`stats_loader`). The memo reads a pair's comparison from `report/cache/pair-<digest>.json`
(the digest: both cells' cache keys and the comparison's settings, `pair_name`), asks the report
workers for the missing ones (`report --distributed`, controller.report.pairjobs) or computes them
in a process pool, and writes what it computes. The loader gives a comparison both cells' whole
statistics: the reduce holds each cached cell's output `spill`ed (controller.report.cells: its
per-prompt statistics are in the cache only, so the controller's memory grows by a row per cell,
not by a cell's prompts), and a comparison reads them again, a few cells at a time (a model's
baseline is compared with each of its cells, so the last few read are kept). A pool process, or a
report worker, reads them from the store itself: its arguments are the store's URL and the keys.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from controller.metrics import METRICS
from controller.report.cells import CACHE_VERSION, CellOutput, Settings, Tick, from_cache, plain, run_cell
from controller.report.intervals import cell_rng
from controller.report.paired import CellStats, compare_cells
from worker.core import paths
from worker.core.errors import CorruptRecordError

KEPT = 8  # whole cells' statistics a comparison keeps read (a model's baseline is read once, not per cell)
Ref = CellStats | tuple[str, str]  # a cell's statistics, or (store URL, its cache key) to read them from


@functools.lru_cache(maxsize=KEPT)
def _cached(url: str, key: str) -> CellStats:
    """A cell's statistics in a pool process (keys are digests of what the entry holds: never stale)."""
    from worker.store import open_store

    out = from_cache(open_store(url), key)
    if out is None or out.stats is None:
        raise CorruptRecordError(f"{url.rstrip('/')}/{key}: a compared cell's output left the report cache")
    return out.stats


def _read(ref: Ref) -> CellStats:
    return ref if isinstance(ref, CellStats) else _cached(*ref)


def pair_task(args: tuple[Ref, Ref, tuple[str, ...], int, int]) -> dict:
    """One (cell, baseline) pair, as the controller computes it: here, in a pool process or in a report worker."""
    from controller.report.paired import compare_pair

    a, b, names, n_boot, seed = args
    a, b = _read(a), _read(b)
    metrics = {n: METRICS.get(n) for n in names}
    return compare_pair(a, b, metrics, n_boot=n_boot, rng=cell_rng(seed, f"{a.cell}|paired"))


def pair_name(cell_key: str, base_key: str, n_boot: int, seed: int, baseline: str | None) -> str:
    """A pair's cache digest, from both cells' cache keys and the comparison's settings."""
    doc = [CACHE_VERSION, cell_key, base_key, n_boot, seed, baseline]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


def pair_key(tenant: str, sweep_id: str, name: str) -> str:
    """Where a pair's comparison is cached: beside its cells' outputs."""
    return paths.report_key(tenant, sweep_id, f"cache/pair-{name}.json")


def pair_json(pair: dict) -> dict:
    return {k: plain(v) for k, v in pair.items()}


def stats_loader(store, outputs: list[CellOutput], recompute: Callable[[str], CellOutput]) -> Callable:
    """`compare_cells`' loader: a cell's whole statistics, read again from the cache where its output
    was spilled (the last KEPT kept), else the ones held. `recompute(cell)` is the cell's output
    computed afresh, for an entry that left the cache meanwhile (deleting report/cache/ stays safe)."""
    keys = {o.row["cell"]: o.digest for o in outputs if o.spilled}

    @functools.lru_cache(maxsize=KEPT)
    def load(cell: str) -> CellStats:
        out = from_cache(store, keys[cell])
        if out is None or out.stats is None:
            out = recompute(cell)
        return out.stats  # type: ignore[return-value]

    return lambda stats: load(stats.cell) if stats.cell in keys else stats


def _cached_pair(store, key: str) -> dict | None:
    """A pair's cached comparison; None where it is damaged (computed again)."""
    try:
        return store.read_json(key)
    except CorruptRecordError:
        return None


def _entries(store, keys: dict[str, str | None]) -> set[str]:
    """The report cache's entries beside these cells' cache keys: one listing, not a round trip per pair."""
    cache = next((k.rsplit("/", 1)[0] + "/" for k in keys.values() if k is not None), None)
    return set(store.list(cache)) if store is not None and cache is not None else set()


def pair_memo(
    store, outputs: list[CellOutput], settings: Settings, baseline: str | None, *, selected=(), workers: int = 1,
    remote=None, progress: Tick | None = None,
):  # fmt: skip
    """`compare_cells`' memo: a pair's comparison cached beside its cells' outputs, keyed by both.

    The pairs missing from the cache are asked of `remote` first (its `pairs(keys, settings,
    baseline)`: the report workers, controller.report.remote), which returns once their entries
    are in the cache or given up on; with `workers` != 1 what is still missing is computed in a
    process pool, like the cells (both only with the global registry's metrics), each process
    reading a spilled cell's statistics from the store. `progress("pairs", done, total)` is called as
    each pair's comparison is had (read, received or computed)."""
    from controller.report.paired import baselines

    digests = {o.row["cell"]: o.digest for o in outputs}

    def key_of(cell: str, base: str) -> str | None:
        if store is None or digests.get(cell) is None or digests.get(base) is None:
            return None
        name = pair_name(digests[cell], digests[base], settings.n_boot, settings.seed, baseline)  # type: ignore[arg-type]
        return digests[cell].rsplit("/", 1)[0] + f"/pair-{name}.json"  # type: ignore[union-attr]

    ready: dict[tuple[str, str], dict] = {}
    stats = {o.row["cell"]: o.stats for o in outputs if o.stats is not None}
    compared = [(c, b) for c, b in baselines(list(stats.values()), baseline).items() if b is not None]
    total = len(compared)
    had, shown = [0], [0]

    def show(n: int) -> None:  # never backwards: the report workers' count, then this process's
        if progress is not None and n > shown[0]:
            shown[0] = n
            progress("pairs", n, total)

    refs: dict[str, Ref] = {o.row["cell"]: (store.url, o.digest) if o.spilled else o.stats for o in outputs}  # type: ignore[misc]
    early = all(n in METRICS and METRICS.get(n) is m for n, m in selected) and (remote is not None or workers != 1)
    cached = _entries(store, digests)
    todo = [(c, b) for c, b in compared if key_of(c, b) not in cached] if early else []
    if remote is not None and (keys := [k for c, b in todo if (k := key_of(c, b))]):
        remote.pairs(keys, settings, baseline, lambda ready: show(total - len(todo) + ready))
        cached = _entries(store, digests)
        todo = [(c, b) for c, b in todo if key_of(c, b) not in cached]
    if workers != 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=workers if workers > 0 else os.cpu_count()) as pool:
            args = [(refs[c], refs[b], settings.names, settings.n_boot, settings.seed) for c, b in todo]
            for pair, result in zip(todo, pool.map(pair_task, args, chunksize=1)):
                ready[pair] = result
                show(total - len(todo) + len(ready))

    def memo(cell: str, base: str, compute):
        key = key_of(cell, base)
        had[0] += 1
        pair = None if (cell, base) in ready or key not in cached else _cached_pair(store, key)
        if pair is None:
            pair = ready.pop((cell, base), None) or compute()
            if key is not None:
                store.write_json(key, pair_json(pair))
        show(had[0])
        return pair

    return memo


def compare(outputs, tasks, selected, settings: Settings, baseline, store, workers, remote, progress) -> dict:
    """`summarize`'s comparisons: each cell's with its baseline (`paired.compare_cells`, Holm over the
    table), through the cache (`pair_memo`) and with the spilled cells' statistics read again (`stats_loader`)."""
    by_cell = {t.cell: t for t in tasks}
    return compare_cells(
        [o.stats for o in outputs if o.stats is not None],
        dict(selected),
        baseline=baseline,
        n_boot=settings.n_boot,
        rng_for=lambda cell: cell_rng(settings.seed, f"{cell}|paired"),
        memo=pair_memo(
            store, outputs, settings, baseline, selected=selected, workers=workers, remote=remote, progress=progress
        ),  # fmt: skip
        load=stats_loader(store, outputs, lambda cell: run_cell(by_cell[cell], selected, settings)),
    )
