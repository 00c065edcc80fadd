"""The paired comparisons as report jobs: one signed job per (cell, baseline) pair missing from the cache.

Once a report's cells are in the cache, `report --distributed` asks the signer for the pairs
(controller.report.remote: `Dispatch.pairs`, `enqueue_pair_report`): the submission server for a
tenant, or the operator's own process, plans them here from the store (`plan_pairs`: the tenant's
cells as `summarize` plans them, the same digests, the same `paired.baselines`) and enqueues one job
per pair missing from the cache on the tenant's report queue, calling the same function as a cell's
job with `kind: "pair"` in its payload. The payload is ids and settings only: both cells' digests,
the pair's digest (`paircache.pair_name` of both cells' cache keys and the settings), the metric names,
n_boot, seed, baseline. A report worker checks it (`pair_refusal`: the pair's digest must be what its
cells and settings give, so its key is always under the queue's tenant and the payload's sweep),
reads both cells' cached outputs from its own store and computes the pair as the controller would
(`paircache.pair_task`: the same draws), then writes `cache/pair-<digest>.json` (what `paircache.pair_memo`
reads) or `pair-<digest>.fail.json` with a reason.
"""

from __future__ import annotations

from typing import Any

from controller.metrics import METRICS
from controller.report import plancache
from controller.report.cells import DIGEST, MAX_N_BOOT, cache_key, from_cache
from controller.report.paircache import pair_json, pair_key, pair_name, pair_task
from controller.report.paired import CellStats, baselines
from worker.core import paths
from worker.core.errors import PermanentJobError

PAIR = "pair"  # the payload's `kind`; a cell's payload has none
MAX_BASELINE = 1024  # characters of a baseline (a strategy name or a cell key)
FIELDS = {"kind", "tenant", "sweep_id", "cell", "base", "pair", "names", "n_boot", "seed", "baseline"}


def pair_payload(tenant: str, sweep_id: str, cell: str, base: str, names, n_boot: int, seed: int,
                 baseline: str | None) -> dict[str, Any]:  # fmt: skip
    """A pair job's payload: `cell` and `base` are the two cells' digests."""
    name = pair_name(cache_key(tenant, sweep_id, cell), cache_key(tenant, sweep_id, base), n_boot, seed, baseline)
    return {"kind": PAIR, "tenant": tenant, "sweep_id": sweep_id, "cell": cell, "base": base, "pair": name,
            "names": list(names), "n_boot": n_boot, "seed": seed, "baseline": baseline}  # fmt: skip


def fail_key(tenant: str, sweep_id: str, name: str) -> str:
    return paths.report_key(tenant, sweep_id, f"cache/pair-{name}.fail.json")


def plan_pairs(store, tenant: str, sweep_id: str, *, n_boot: int, seed: int, n_boot_corpus: int, baseline: str | None,
               memo: plancache.PlanMemo | None = None) -> tuple[int, list[dict[str, Any]]]:  # fmt: skip
    """The sweep's compared pairs (how many), and the payloads of those missing from the cache whose
    two cells are both cached (a pair with a cell not cached is left to the controller). Planned
    from the store only: the cells as `summarize` plans them (or, with `memo`, as the cells' call
    planned them if the sweep's fingerprint has not changed since: no result.json read), each compared
    with the baseline `paired.baselines` gives it (from the cells' keys, models and strategies, as in
    the reduce)."""
    found = plancache.lookup(memo, store, tenant, sweep_id, n_boot, seed, n_boot_corpus)
    basis = found.basis or found.plan()[1]
    settings = basis.settings
    if not settings.with_ci:  # no intervals, no comparisons
        return 0, []
    digests = basis.digests
    cells = [CellStats(cell, model, strategy, [], {}) for cell, model, strategy, _ in basis.cells]
    pairs = [(c, b) for c, b in baselines(cells, baseline).items() if b is not None]
    cached = {k.rsplit("/", 1)[1] for k in store.list(paths.report_key(tenant, sweep_id, "cache/"))}
    todo = []
    for c, b in pairs:
        dc, db = digests[c], digests[b]
        if dc is None or db is None or f"{dc}.json" not in cached or f"{db}.json" not in cached:
            continue
        doc = pair_payload(tenant, sweep_id, dc, db, settings.names, n_boot, seed, baseline)
        if f"pair-{doc['pair']}.json" in cached:
            continue
        if f"pair-{doc['pair']}.fail.json" in cached:  # an earlier attempt's mark: this one starts afresh
            store.delete(fail_key(tenant, sweep_id, doc["pair"]))
        todo.append(doc)
    return len(pairs), todo


def pair_refusal(doc: dict, tenant: str) -> str | None:
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
    for name, most in (("n_boot", MAX_N_BOOT), ("seed", 2**63)):
        if type(doc[name]) is not int or not 0 <= doc[name] <= most:
            return f"refused: the pair job's {name} is out of bounds"
    base = doc["baseline"]
    if base is not None and (not isinstance(base, str) or len(base) > MAX_BASELINE):
        return f"refused: the pair job's baseline is not a string of at most {MAX_BASELINE} characters"
    expected = pair_payload(tenant, doc["sweep_id"], doc["cell"], doc["base"], names, doc["n_boot"], doc["seed"], base)
    if doc["pair"] != expected["pair"]:
        return "refused: the pair job's digest is not its cells' and settings'"
    return None


def run_pair(store, doc: dict) -> dict[str, Any]:
    """A pair job, in a report worker: both cells' outputs from the worker's own store's cache, the
    comparison computed as the controller computes it, its cache entry written (or its failure mark)."""
    tenant, sweep_id, name = doc["tenant"], doc["sweep_id"], doc["pair"]
    try:
        a, b = (from_cache(store, cache_key(tenant, sweep_id, doc[k])) for k in ("cell", "base"))
        if a is None or b is None or a.stats is None or b.stats is None:
            raise PermanentJobError("a cell of the pair is not in the report cache (or has no statistics)")
        pair = pair_task((a.stats, b.stats, tuple(doc["names"]), doc["n_boot"], doc["seed"]))
    except Exception as err:
        store.write_json(fail_key(tenant, sweep_id, name), {"reason": (str(err).splitlines() or [repr(err)])[0][:300]})
        raise
    store.write_json(pair_key(tenant, sweep_id, name), pair_json(pair))
    return {"pair": name, "cell": a.stats.cell, "base": b.stats.cell}
