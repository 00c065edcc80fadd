"""A sweep's results as pandas DataFrames, for notebooks and scripts.

    from controller.report.api import load_summary, load_generations
    summary = load_summary("3f2a9c", store="./runs")      # a sweep id or a unique prefix
    gens = load_generations("3f2a9c", store="./runs")

`store` is a Store, a URL (`./runs`, `file:///…`, `s3://bucket/prefix`) or None
(DECODEBENCH_STORE, else ./runs).
"""

from __future__ import annotations

import io

import pandas as pd

from controller.report.aggregate import load_sweep, summarize
from worker.core import paths
from worker.core.errors import UsageError
from worker.store import Store, open_store


def _open(store: Store | str | None) -> Store:
    return store if isinstance(store, Store) else open_store(str(store) if store is not None else None)


def load_summary(
    sweep: str,
    store: Store | str | None = None,
    tenant: str = "default",
    *,
    recompute: bool = False,
    n_boot: int = 1000,
) -> pd.DataFrame:
    """The summary of a sweep: one row per (model, strategy variant) cell plus `reference`.

    Reads `report/summary.parquet` when it covers every complete job; otherwise (or with
    `recompute=True`) aggregates the complete jobs now, without writing anything.
    """
    st = _open(store)
    sweep_id = st.resolve_sweep(tenant, sweep)
    key = paths.report_key(tenant, sweep_id, "summary.parquet")
    if not recompute and st.exists(key):
        frame = pd.read_parquet(io.BytesIO(st.read_bytes(key)))
        if int(frame["n_jobs"].fillna(0).sum()) == len(st.complete_job_ids(tenant, sweep_id)):
            return frame
    data = load_sweep(st, tenant, sweep_id)
    if not data.results:
        raise UsageError(f"sweep {sweep_id} has no complete jobs yet")
    return summarize(data, n_boot=n_boot)


def load_generations(sweep: str, store: Store | str | None = None, tenant: str = "default") -> pd.DataFrame:
    """Every generation of the sweep's complete jobs, once each: one row per generation.

    Columns are generations.jsonl's fields (job_id, cell, model, strategy, params, seed,
    job_seed, prompt_id, prompt, reference, text, token_ids, n_new_tokens, stop_reason,
    batch, nll_sum, nll_count).
    """
    st = _open(store)
    data = load_sweep(st, tenant, st.resolve_sweep(tenant, sweep))
    columns = list(data.generations[0].model_dump()) if data.generations else []
    return pd.DataFrame([g.model_dump() for g in data.generations], columns=columns or None)
