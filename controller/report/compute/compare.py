"""Comparing two sweeps' summaries cell by cell (`decodebench report A --compare B`): the differences of their
numbers (`compare`), and where both sweeps hold the same prompts, each matched pair of cells compared paired over
them (`paired_across`), as a sweep compares its own cells (controller.report.stats.paired)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from controller.metrics import Metric
from controller.report.compute.aggregate import cell_statistics
from controller.report.compute.columns import KEY_COLUMNS, PAIRED_COLUMN, PROMPTS_ATTR, SAMPLES_COLUMNS
from controller.report.compute.pairs import CellRef, Stats, read_stats
from controller.report.load.jobs import MIN_CI_PROMPTS
from controller.report.load.sweep import SweepData
from controller.report.stats.intervals import cell_rng
from controller.report.stats.paired import FIRSTS_COLUMN, SUFFIXES, compare_pair, holm, is_comparison_column
from controller.sweep.load import inner_spec
from worker.core.contract import ModelSpec, PromptItem
from worker.core.engines import OWN_ENGINE
from worker.core.errors import CorruptRecordError, UsageError
from worker.store import Store


def compare(summary_a: pd.DataFrame, summary_b: pd.DataFrame, models: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Per-cell differences B - A, cells matched on (model, strategy, params; engine, samples where a sweep has them).

    Columns: model, strategy, params, `present` (both, a, b), then `<col>_delta` for
    every numeric column the two share (CI and paired-comparison columns excepted), then `<col>_a`, `<col>_b`.
    `models`: A's model label -> B's that its cells match (`model_pairs`); the engines are paired by `engine_pair`;
    a paired row's model or engine is `a → b`.
    """
    models = dict(models or {})

    def keyed(s: pd.DataFrame, rename: Mapping[str, str]) -> pd.DataFrame:
        s = s.copy()
        s["model"] = s["model"].astype(object).where(s["model"].notna(), "").map(lambda m: rename.get(m, m))
        return s

    a, b = keyed(summary_a, models), keyed(summary_b, {})
    # sweeps with several engines (docs/engines.md) match cells on the engine too; the own engine's label
    # stands for a summary without the column
    keys = list(KEY_COLUMNS)
    engines: dict[str, str] = {}
    if "engine" in a.columns or "engine" in b.columns:
        for s in (a, b):
            s["engine"] = s["engine"].fillna(OWN_ENGINE) if "engine" in s.columns else OWN_ENGINE
        engines = engine_pair(a, b)
        cells_a = a["model"] != ""  # the reference row, the prompts' own, ran on no engine: it stays as it is
        a.loc[cells_a, "engine"] = a.loc[cells_a, "engine"].map(lambda e: engines.get(e, e))
        keys.append("engine")
    for column in SAMPLES_COLUMNS:  # a variant with samples is a cell of its own (docs/sweeps.md#samples)
        if column in a.columns or column in b.columns:
            for s in (a, b):
                s[column] = s[column].astype(object).where(s[column].notna(), "") if column in s.columns else ""
            keys.append(column)
    shared = [
        c
        for c in a.columns
        if c in b.columns
        and c not in keys
        and "_ci_" not in c
        and not is_comparison_column(c)  # a sweep's own paired comparisons are not compared across sweeps
        and pd.api.types.is_numeric_dtype(a[c])
        and pd.api.types.is_numeric_dtype(b[c])
    ]
    cells = ["cell"] if "cell" in a.columns and "cell" in b.columns else []
    merged = a[keys + cells + shared].merge(
        b[keys + cells + shared], on=keys, how="outer", suffixes=("_a", "_b"), indicator=True, sort=False
    )
    out = merged[keys].copy()
    out["present"] = merged["_merge"].map({"both": "both", "left_only": "a", "right_only": "b"}).astype(object)
    for side in ("a", "b") if cells else ():  # each side's cell key (`paired_across` reads its statistics)
        out[f"cell_{side}"] = merged[f"cell_{side}"].astype(object).where(merged[f"cell_{side}"].notna(), None)
    deltas = {f"{c}_delta": merged[f"{c}_b"].astype(float) - merged[f"{c}_a"].astype(float) for c in shared}
    sides = {f"{c}_{side}": merged[f"{c}_{side}"] for c in shared for side in ("a", "b")}
    out = pd.concat([out, pd.DataFrame(deltas), pd.DataFrame(sides)], axis=1)
    for column in ["model", *(c for c in SAMPLES_COLUMNS if c in keys)]:  # the merge's blanks: None again
        out[column] = out[column].where(out[column] != "", None)
    for column, pairs in (("model", models), ("engine", engines)):  # a paired row names both sides: `a → b`
        shown = {b_label: f"{a_label} → {b_label}" for a_label, b_label in pairs.items() if a_label != b_label}
        if shown:
            out[column] = out[column].map(lambda v, shown=shown: shown.get(v, v) if isinstance(v, str) else v)
    return out.reset_index(drop=True)


def engine_pair(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, str]:
    """Where each sweep's cells ran on one engine and they differ (the same sweep run again on vLLM), A's engine ->
    B's, so that their cells match; else none (cells match on their engines, docs/engines.md)."""
    ran_a, ran_b = (list(dict.fromkeys(s.loc[s["model"] != "", "engine"])) for s in (a, b))  # not the reference's
    return one_each(ran_a, ran_b)


def one_each(labels_a: Sequence[str], labels_b: Sequence[str]) -> dict[str, str]:
    """{A's label: B's} where each side has one and they differ (a model's, an engine's); else none."""
    return {labels_a[0]: labels_b[0]} if len(labels_a) == len(labels_b) == 1 and labels_a != labels_b else {}


def resolve_pairs(store: Store, tenant: str, sweep_a: str, sweep_b: str, given: Sequence[str]) -> tuple:
    """Both sweeps' ids and which of B's models each of A's is compared with (`model_pairs` of their specs'
    models and `given`), checked before either sweep is aggregated: (id_a, id_b, pairs)."""
    ids = [store.resolve_sweep(tenant, sweep) for sweep in (sweep_a, sweep_b)]
    if ids[0] == ids[1]:  # every difference 0, every p 1: a comparison that says nothing
        raise UsageError(f"--compare {sweep_b}: that is sweep {ids[0]} itself; compare it with another sweep")
    return *ids, model_pairs(*(sweep_models(store, tenant, sweep_id) for sweep_id in ids), given)


def sweep_models(store: Store, tenant: str, sweep_id: str) -> list[str]:
    """The labels of a sweep's models, in its spec's order (none where its spec.json is missing or damaged)."""
    try:
        spec = inner_spec(store.load_spec(tenant, sweep_id))
        models = [ModelSpec.model_validate(m).label for m in spec.get("models") or []]
    except (CorruptRecordError, KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return []
    return list(dict.fromkeys(models))


def model_pairs(labels_a: Sequence[str], labels_b: Sequence[str], given: Sequence[str] = ()) -> dict[str, str]:
    """Which of B's models each of A's is compared with (`compare`'s `models`), from both sweeps' model labels:
    `given` (`A_MODEL=B_MODEL`, each checked against them); else, where each sweep has one model and they differ,
    that one with the other (a sweep run again with another model, or a new revision); else none (cells match on
    their own labels)."""
    if not given:
        return one_each(labels_a, labels_b)
    pairs: dict[str, str] = {}
    for text in given:
        a_label, sep, b_label = text.partition("=")
        for label, have, side in ((a_label, labels_a, "A"), (b_label, labels_b, "B")):
            if not sep or label not in have:
                raise UsageError(
                    f"--models {text!r}: not A_MODEL=B_MODEL with {label!r} a model of sweep {side}"
                    f" (sweep A's: {', '.join(labels_a) or 'none'}; sweep B's: {', '.join(labels_b) or 'none'})"
                )
        if a_label in pairs or b_label in pairs.values():
            raise UsageError(f"--models {text!r}: each model is paired with one other at most")
        pairs[a_label] = b_label
    renamed = [pairs.get(m, m) for m in labels_a]
    if len(set(renamed)) < len(renamed):  # A's y, not paired itself, would meet A's x paired with y
        twice = next(m for m in renamed if renamed.count(m) > 1)
        raise UsageError(f"--models: two of sweep A's models would be compared with {twice!r}; pair {twice!r} too")
    return pairs


def same_prompts(a: Sequence[PromptItem], b: Sequence[PromptItem]) -> set[str]:
    """The ids of the prompts both sweeps hold alike: the same id, text, reference, messages and answer."""
    of_b = {p.id: p for p in b}
    return {p.id for p in a if of_b.get(p.id) == p}


def paired_across(
    comparison: pd.DataFrame,
    stats: tuple[Mapping[str, Stats], Mapping[str, Stats]],
    metrics: Mapping[str, Metric],
    same: set[str],
    *,
    n_boot: int,
    seed: int = 0,
) -> pd.DataFrame:
    """`comparison` (`compare`'s) with each matched pair of cells compared paired, B − A: `<m>_diff`, its paired
    interval and p, and Holm's p over every p of the table (`SUFFIXES`; the first generations' where the cells'
    generations a prompt differ, named in `first_generation_diffs`), and `paired_prompts`. `stats`: both sweeps'
    cell statistics by cell key (`aggregate.cell_statistics`). A pair is compared where both cells have
    statistics and the same prompts, at least MIN_CI_PROMPTS, every one alike in both sweeps (`same`); the
    other rows' columns are empty."""
    rows: list[dict] = []
    for _, row in comparison.iterrows():
        a, b = (side.get(row.get(f"cell_{s}") or "") for side, s in zip(stats, "ab"))
        rows.append({})
        if a is None or b is None:
            continue
        a, b = (s.stats() if isinstance(s, CellRef) else s for s in (a, b))
        if set(a.prompts) == set(b.prompts) and set(a.prompts) <= same and len(a.prompts) >= MIN_CI_PROMPTS:
            rng = cell_rng(seed, f"{row['cell_b']}|{row['cell_a']}|across")
            rows[-1] = compare_pair(b, a, metrics, n_boot=n_boot, rng=rng) | {PAIRED_COLUMN: len(a.prompts)}
    names = list(metrics)
    paired = pd.DataFrame(rows, index=comparison.index).reindex(
        columns=[PAIRED_COLUMN, FIRSTS_COLUMN, *(f"{m}{s}" for m in names for s in SUFFIXES)]
    )
    p = paired[[f"{m}_diff_p" for m in names]].to_numpy(dtype=float)
    holm_p = np.asarray(holm(p.ravel().tolist()), dtype=float).reshape(p.shape)  # NaN: no test, not counted
    for j, m in enumerate(names):
        paired[f"{m}_diff_p_holm"] = holm_p[:, j]
    numeric = [c for c in paired.columns if c != FIRSTS_COLUMN]
    paired[numeric] = paired[numeric].apply(pd.to_numeric, errors="coerce").astype(float)
    paired[FIRSTS_COLUMN] = paired[FIRSTS_COLUMN].astype(object).where(paired[FIRSTS_COLUMN].notna(), None)
    return pd.concat([comparison, paired], axis=1)


def compare_sweeps(
    store: Store | None,
    a: tuple[SweepData, pd.DataFrame],
    b: tuple[SweepData, pd.DataFrame],
    n_boot: int,
    models: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Two sweeps' (data, summary) compared (`compare`, A's models paired with B's by `models`, `model_pairs`'), each
    pair of matched cells paired over the prompts both sweeps hold alike where both have intervals (`paired_across`);
    `store`: where their summaries cached their cells (`aggregate.summarize`), read back here."""
    comparison = compare(a[1], b[1], models)
    same = same_prompts(a[0].prompts, b[0].prompts)
    counts = {"a": len(a[0].prompts), "b": len(b[0].prompts), "alike": len(same)}
    comparison.attrs[PROMPTS_ATTR] = counts  # the table's note reads them (render.comparisons.untested_note)
    if len(same) < MIN_CI_PROMPTS or n_boot == 0:
        return comparison
    (selected, stats_a), (other, stats_b) = (cell_statistics(d, n_boot=n_boot, store=store) for d, _ in (a, b))
    if not stats_a or not stats_b:
        return comparison
    names_b = {name for name, _ in other}
    metrics = {name: metric for name, metric in selected if name in names_b}
    try:
        paired = paired_across(comparison, (stats_a, stats_b), metrics, same, n_boot=n_boot)
    finally:
        read_stats.cache_clear()  # the last cells read back: not kept past the comparison
    paired.attrs = dict(comparison.attrs)  # not left to pd.concat, which keeps attrs only where all inputs agree
    return paired
