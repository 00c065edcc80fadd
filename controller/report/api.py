"""A sweep's results as pandas DataFrames, for notebooks and scripts.

    from controller.report.api import load_summary, load_generations
    summary = load_summary("3f2a9c", store="./runs")      # a sweep id or a unique prefix
    gens = load_generations("3f2a9c", store="./runs")

`summary` holds, with 8 prompts or more a cell, each cell's paired comparison against its baseline
(`baseline`, `first_generation_diffs`, `<metric>_diff`, `_diff_ci_low`, `_diff_ci_high`, `_diff_p`, `_diff_p_holm`);
`comparisons(summary)` gives them in long form, one row per (cell, metric). `variant_labels(summary)` and
`cell_labels(summary)` name each row as every view of the report does (`top_p(p=0.8)`,
`austen-tiny · top_p(p=0.8)`; controller.report.render.labels).
`compare_sweeps(a, b)` compares two sweeps cell by cell (`report A --compare B`), paired over the prompts they
hold alike. `build(store, tenant, sweep)` is the reduce as `decodebench report` runs it: the summary with its cells
cached in the store, and the sweep's ratings and judge (`with_extras`).

`store` is a Store, a URL (`./runs`, `file:///…`, `s3://bucket/prefix`) or None
(DECODEBENCH_STORE, else ./runs).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import pandas as pd

from controller.report.compute.aggregate import summarize
from controller.report.compute.runner import Runner
from controller.report.load.sweep import SweepData, load_sweep
from controller.report.render.labels import cell_labels, variant_labels
from controller.report.stats.paired import on_first_generations
from worker.core import paths
from worker.core.errors import UsageError
from worker.store import Store, open_store

__all__ = ["cell_labels", "comparisons", "load_generations", "load_summary", "variant_labels"]


def _open(store: Store | str | None) -> Store:
    return store if isinstance(store, Store) else open_store(str(store) if store is not None else None)


def load_summary(
    sweep: str,
    store: Store | str | None = None,
    tenant: str = "default",
    *,
    recompute: bool = False,
    n_boot: int = 1000,
    baseline: str | None = None,
) -> pd.DataFrame:
    """The summary of a sweep: one row per (model, strategy variant) cell plus `reference`.

    Reads `report/summary.parquet` when it covers every complete job; otherwise (or with
    `recompute=True`) aggregates the complete jobs now, without writing or sending anything: with the imported
    human ratings and the judge's verdicts the last report stored (`stored_extras`). `baseline`
    (a strategy name or cell key) recomputes the paired comparisons against it.
    """
    st = _open(store)
    sweep_id = st.resolve_sweep(tenant, sweep)
    key = paths.report_key(tenant, sweep_id, "summary.parquet")
    if not recompute and baseline is None and st.exists(key):
        frame = pd.read_parquet(io.BytesIO(st.read_bytes(key)))
        if int(frame["n_jobs"].fillna(0).sum()) == len(st.complete_job_ids(tenant, sweep_id)):
            return current_ratings(frame, st, tenant, sweep_id)
    data = load_sweep(st, tenant, sweep_id)
    if not data.results:
        raise UsageError(f"sweep {sweep_id} has no complete jobs yet")
    return stored_extras(summarize(data, n_boot=n_boot, baseline=baseline), st, data, n_boot)


def current_ratings(frame: pd.DataFrame, store: Store, tenant: str, sweep_id: str) -> pd.DataFrame:
    """A stored summary with the ratings imported now, not those of the report that wrote it (a `rate import`
    after the report changed nothing here until the next report)."""
    from controller.report.ratings.scores import add_ratings, stored_ratings

    kept = frame[[c for c in frame.columns if not c.startswith("rating_")]]
    return add_ratings(kept, stored_ratings(store, tenant, sweep_id))


def stored_extras(summary: pd.DataFrame, store: Store, data: SweepData, n_boot: int) -> pd.DataFrame:
    """`with_extras`, reading only: the imported human ratings and the judge's stored verdicts (the last report's),
    nothing sent (a recomputed summary had neither: its rating and judge columns were gone)."""
    from controller.judge.report import add_judge, stored_judge

    judged = stored_judge(store, data.tenant, data.sweep_id, data.sweep_spec, n_boot)
    return add_judge(current_ratings(summary, store, data.tenant, data.sweep_id), judged)


def load_generations(sweep: str, store: Store | str | None = None, tenant: str = "default") -> pd.DataFrame:
    """Every generation of the sweep's complete jobs, once each: one row per generation.

    Columns are generations.jsonl's fields (job_id, cell, model, strategy, params, seed,
    job_seed, prompt_id, sample, best_of, prompt, reference, text, token_ids, n_new_tokens, stop_reason,
    batch, nll_sum, nll_count, ...): a variant's samples are rows of their own, a prompt's `sample` 0 to n - 1.
    """
    st = _open(store)
    data = load_sweep(st, tenant, st.resolve_sweep(tenant, sweep))
    columns = list(data.generations[0].model_dump()) if data.generations else []
    return pd.DataFrame([g.model_dump() for g in data.generations], columns=columns or None)


def comparisons(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary's paired comparisons in long form: cell, baseline, metric, diff, ci_low, ci_high, p, p_holm, and
    first_generations (True where the metric was compared on each prompt's first generation in both cells)."""
    rows = []
    for _, row in summary.iterrows():
        if not isinstance(row.get("baseline"), str):
            continue
        firsts = on_first_generations(row)
        for col in summary.columns:
            if col.endswith("_diff"):
                m = col[: -len("_diff")]
                if pd.notna(row[col]):
                    rows.append(
                        {
                            "cell": row["cell"],
                            "baseline": row["baseline"],
                            "metric": m,
                            "diff": row[col],
                            "ci_low": row[f"{m}_diff_ci_low"],
                            "ci_high": row[f"{m}_diff_ci_high"],
                            "p": row[f"{m}_diff_p"],
                            "p_holm": row[f"{m}_diff_p_holm"],
                            "first_generations": m in firsts,
                        }
                    )
    columns = ["cell", "baseline", "metric", "diff", "ci_low", "ci_high", "p", "p_holm", "first_generations"]
    return pd.DataFrame(rows, columns=columns)


def compare_sweeps(
    sweep_a: str,
    sweep_b: str,
    store: Store | str | None = None,
    tenant: str = "default",
    *,
    n_boot: int = 1000,
    models: Sequence[str] = (),
) -> pd.DataFrame:
    """`decodebench report A --compare B` as a DataFrame: one row per cell matched across the two sweeps, `present`,
    `cell_a`, `cell_b`, `<column>_delta` (B − A) with `<column>_a` and `<column>_b`, and where both sweeps hold the
    same prompts with intervals, `paired_prompts` and each metric's paired comparison B − A (`<metric>_diff`,
    `_diff_ci_low`, `_diff_ci_high`, `_diff_p`, `_diff_p_holm`, Holm over the whole table). Like the command, it
    aggregates both sweeps through the store's report cache (`report/cache/`, written as `report` does). `models`:
    `A_MODEL=B_MODEL` pairs, as `--models` (two sweeps of one model each are paired by themselves)."""
    from controller.report.compute.compare import compare_sweeps as compared
    from controller.report.compute.compare import resolve_pairs

    st = _open(store)
    id_a, id_b, pairs = resolve_pairs(st, tenant, sweep_a, sweep_b, models)
    a, b = (build(st, tenant, sweep_id, n_boot) for sweep_id in (id_a, id_b))
    return compared(st, a, b, n_boot, pairs)


def build(
    store: Store,
    tenant: str,
    sweep: str,
    n_boot: int = 1000,
    baseline: str | None = None,
    workers: int = 1,
    remote=None,
    progress=None,
) -> tuple[SweepData, pd.DataFrame]:
    """Load SWEEP's results (not its generations: each cell streams its own) and summarise it;
    `workers` cells at a time in a process pool, each cell's output cached in the store; `remote`
    (controller.report.distribute.remote.ReportWorkers): the cells and pairs missing from the cache computed by
    report workers;
    `progress(what, done, total)`: the results read, the cells, the pairs (controller.cli.progress)."""
    sweep_id = store.resolve_sweep(tenant, sweep)
    data = load_sweep(store, tenant, sweep_id, with_generations=False, progress=progress)
    if not data.results:
        raise UsageError(f"sweep {sweep_id} has no complete jobs yet; {_where_jobs_are(data)}")
    summary = summarize(
        data, n_boot=n_boot, baseline=baseline, workers=workers, store=store, remote=remote, progress=progress
    )
    return data, with_extras(summary, store, data, n_boot, Runner(workers, remote, progress))


def _where_jobs_are(data: SweepData) -> str:
    """Where to see why a sweep has no complete job: a submitted sweep's state is in Redis (`status`); a local run's
    is in no Redis: `run` named its failures, and each job's log is in the store."""
    if (data.spec or {}).get("mode") == "local":
        return (
            "`decodebench run SPEC` names why its jobs failed (run again, it resumes); a job's log: "
            f"`decodebench logs JOB --sweep {data.sweep_id}` (with the same --store)"
        )
    return f"see `decodebench status {data.sweep_id}`"


def with_extras(
    summary: pd.DataFrame, store: Store, data: SweepData, n_boot: int = 1000, runner=None, judge_limits=None
) -> pd.DataFrame:
    """The summary with what lives beside the jobs: imported human ratings and the sweep's judge (docs/judge.md),
    its requests sent by `runner`'s backends (default: here), within `judge_limits` where given (`run`'s sweep
    file's) or the stored spec's."""
    from controller.judge.report import add_judge, judge_summary
    from controller.report.ratings.scores import add_ratings, stored_ratings

    tenant, sweep_id = data.tenant, data.sweep_id
    spec, results, order = data.sweep_spec, data.results, data.cell_order
    judged = judge_summary(store, tenant, sweep_id, spec, results, order, n_boot, runner=runner, limits=judge_limits)
    return add_judge(add_ratings(summary, stored_ratings(store, tenant, sweep_id)), judged)
