"""The metric registry: `Metric`, the decorators and `METRICS`. Light (no torch).

A metric is a function of a cell's data (`controller.metrics.cell.CellData`) returning a float, or None where
it does not apply (a metric that does not apply is empty, never zero). Every metric
carries its metadata and declares how it aggregates and how its 95% interval is
computed; `decodebench metrics` lists them. docs/metrics.md has the formulas.

Every metric is corpus level: a function of the whole multiset of a cell's
generations, recomputed from the generations at report time. A metric registers in
one of two ways (as lm-evaluation-harness metrics declare their aggregation):

- additive, `@additive_metric(name, combine=..., ...)` on `per_item(cell)`: one row of
  k statistics per generation (an array of shape (N, k)), or None where the metric does
  not apply to the cell; `combine(sums)` turns the k column sums into the value. The
  value is always `combine(column sums)`, each column summed with `math.fsum`, so it
  does not depend on the order of the generations (1 shard or 4 give identical
  values). Its interval is a studentised bootstrap over prompts computed from the same
  statistics ("bootstrap"), so value and interval cannot disagree.
- plain, `@metric(name, ...)` on `fn(cell)`: any other corpus function (self-BLEU, Zipf),
  whose value a bootstrap's duplicated generations would distort; its interval is the
  delete-one-prompt jackknife: `fn` on the cell without each prompt in turn, or the metric's
  own exact `leave_one_out(cell, groups)` where it declares one (cheaper than G
  recomputations). "half-sample" (delete-half jackknife) stays available. Its paired test is
  a permutation test of the metric recomputed on swapped prompts where it declares
  `swap_items` (self-BLEU's n-gram occurrences, `controller.metrics.overlaps`), else the
  jackknife t-test.
- union, `@union_metric(name, ...)` on `union_items(cell, groups)`: the number of distinct things
  in the cell over the number counted (distinct-n), from each prompt group's distinct items
  (`controller.metrics.unions.UnionItems`). The value, the exact leave-one-out values of its
  jackknife and the paired swap test all come from the same items.

    cell = cell_data(records)            # GenerationRecord objects or dicts
    values = compute_metrics(cell)       # {"rep_2": 0.01, "bleu": None, ...}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

import numpy as np

from controller.metrics.cell import CellData
from controller.metrics.counts import CountItems
from controller.metrics.overlaps import OverlapItems
from controller.metrics.unions import UnionItems
from worker.core.registry import Registry

Interval = Literal["bootstrap", "jackknife", "half-sample", "none"]
Scale = Literal["logit", "linear"]
WorkerNeed = Literal["score", "featurize"]
INTERVALS: tuple[str, ...] = ("bootstrap", "jackknife", "half-sample", "none")


PerItem = Callable[[CellData], "np.ndarray | None"]
Combine = Callable[[Sequence[float]], "float | None"]


def column_sums(stats: np.ndarray) -> list[float]:
    """Each column's sum with `math.fsum`: correctly rounded, so the order of the rows does not matter."""
    return [math.fsum(stats[:, j].tolist()) for j in range(stats.shape[1])]


def item_rows(rows: Sequence[Sequence[float]], k: int) -> np.ndarray:
    """Per-generation statistics as an (N, k) float array; (0, k) for an empty cell."""
    return np.array(rows, dtype=float).reshape(len(rows), k)


def ratio(sums: Sequence[float]) -> float | None:
    """`combine` of a mean or a ratio: sums[0] / sums[1]; None when sums[1] is 0 (nothing counted)."""
    return sums[0] / sums[1] if sums[1] else None


def _additive_value(metric: Metric, cell: CellData) -> float | None:
    stats = metric.stats(cell)
    return None if stats is None else metric.combine(column_sums(stats))


def _union_value(metric: Metric, cell: CellData) -> float | None:
    """|∪ items| / Σ totals of the whole cell as one group; None where it counted nothing."""
    value = metric.union_items(cell, [range(len(cell.texts))]).value()
    return value if math.isfinite(value) else None


@dataclass(frozen=True, kw_only=True)
class Metric:
    """A registered quality metric: its metadata, its value `fn(cell)`, how it aggregates.

    Give either `fn` (a plain corpus metric), or `per_item` and `combine` (an additive
    metric; its `fn` is built from them: `combine(column_sums(per_item(cell)))`), or
    `union_items` (a union metric; its `fn` is the items' value over the whole cell).
    `interval` is "bootstrap" (needs `per_item`; the default of additive metrics),
    "jackknife" (the default of plain ones), "half-sample" or "none" (no interval).
    `leave_one_out(cell, groups)`, optional for a plain metric: the value without each group
    of generations (a prompt's) in turn, as an array of len(groups), exactly what `fn` gives
    on `cell.subset` of the others (NaN where it does not apply), computed faster. The groups
    partition the cell: every generation is in exactly one (distinct-n counts on it).
    """

    name: str
    description: str
    level: Literal["sequence", "corpus"]
    higher_is_better: bool | None  # None: neither (e.g. mean length, Zipf)
    needs_references: bool = False
    needs_model: bool = False
    needs_answers: bool = False  # the prompts' gold `answer` (controller.metrics.answers)
    # what a worker computes for it while it has the model loaded (the planner writes it into each JobSpec):
    # "score" (token NLLs under the scorer) or "featurize" (MAUVE features under the featurizer)
    worker_computes: WorkerNeed | None = None
    fn: Callable[[CellData], float | None] = None  # type: ignore[assignment]  # built for an additive metric
    per_item: PerItem | None = None
    combine: Combine | None = None
    leave_one_out: Callable[[CellData, Sequence[Sequence[int]]], np.ndarray] | None = None
    # a union metric's (|∪ items| / Σ totals, distinct-n) per-prompt items: its leave_one_out and paired swap test
    union_items: Callable[[CellData, Sequence[Sequence[int]]], UnionItems] | None = None
    # a plain metric's per-prompt data from which it is recomputed with prompts swapped between two cells, for its
    # paired permutation test: `swap_items(cell, groups, limit)`, None where more than `limit` items (self-BLEU's
    # n-gram occurrences, controller.metrics.overlaps; Zipf's word counts, controller.metrics.counts); without it a
    # plain metric's test is the jackknife t-test
    swap_items: Callable[[CellData, Sequence[Sequence[int]], int], OverlapItems | CountItems | None] | None = None
    # a value in [0, 1]: its interval is kept inside [0, 1]; a bootstrap one is exact where each prompt of a share is
    # one 0/1 outcome, or every generation is alike (controller.report.stats.shares)
    unit_interval: bool = False
    # the values it can take, (low, high), None where unbounded on that side (mean length (0, None), perplexity
    # (1, None), BLEU (0, 100)): every interval of it is kept inside them, and a paired difference's inside
    # (low - high, high - low) where both are given (controller.report.stats.bootstrap_t.bounded); a unit_interval
    # metric's are (0, 1)
    bounds: tuple[float | None, float | None] = (None, None)
    # an additive metric of one value per prompt (pass@k, maj@k, distinct_answers: answers.per_prompt's rows of
    # (v / n, 1 / n) for each of a prompt's n generations): each prompt's sums are (v, 1) whatever its generations,
    # so a paired test exchanges two cells' prompts as they are, where a per-generation metric's sums are taken per
    # generation (controller.report.stats.swaps.additive)
    per_prompt: bool = False
    # a share of 0/1 outcomes, one a generation, drawn independently given its prompt: each generation's row (v, 1)
    # (exact_match's answers), or a per_prompt metric's share of its prompt's (pass@1: c / n): with several a prompt
    # its interval is Korn and Graubard's, Clopper-Pearson at its effective number of outcomes
    # (controller.report.stats.shares.korn_graubard), not the bootstrap-t
    outcomes: bool = False
    # the scale of a jackknife interval: "logit" (the default of a unit_interval metric) for a share of counted
    # things, whose spread shrinks towards 0 and 1 as p(1 - p) does (distinct-n); "linear" (the default otherwise)
    # for anything else, e.g. a mean of bounded scores (self-BLEU), whose spread is not tied to its level so
    jackknife_scale: Scale | None = None
    # the fewest prompts at which its interval was measured to cover 93-97% on both of the benchmarks' generative
    # processes (docs/reports.md, "Calibrated sizes"), where that is more than the house's 32 (None: the house's,
    # `controller.report.load.jobs.CALIBRATED_PROMPTS`); a report whose smallest cell has fewer says so
    calibrated_prompts: int | None = None
    interval: Interval = None  # type: ignore[assignment]  # None: the default of the metric's kind
    citation: str = ""
    unit: str = ""

    def __post_init__(self) -> None:
        where = f"metric {self.name!r}"
        if self.worker_computes is not None and not self.needs_model:
            raise ValueError(f"{where}: what a worker computes for it (worker_computes) needs a model (needs_model)")
        if (self.per_item is None) != (self.combine is None):
            raise ValueError(f"{where}: per_item and combine go together")
        if self.per_prompt and not self.additive:
            raise ValueError(f"{where}: per_prompt is an additive metric's (per_item rows that sum to one per prompt)")
        if self.outcomes and not (self.additive and self.unit_interval and self.combine is ratio):
            raise ValueError(f"{where}: outcomes is a share's of 0/1 outcomes (additive, ratio, unit_interval)")
        if self.swap_items is not None and (self.union_items is not None or self.additive):
            raise ValueError(f"{where}: swap_items is a plain metric's (a union or additive one swaps its own data)")
        if self.union_items is not None:
            if self.additive or self.fn is not None or self.leave_one_out is not None:
                raise ValueError(f"{where}: a union metric's value and leave_one_out are built from union_items")
            items = self.union_items
            object.__setattr__(self, "fn", partial(_union_value, self))
            object.__setattr__(self, "leave_one_out", lambda cell, groups: items(cell, groups).leave_one_out())
        elif self.additive:
            if self.fn is not None:
                raise ValueError(f"{where}: an additive metric's fn is built from per_item and combine, not given")
            object.__setattr__(self, "fn", partial(_additive_value, self))
        elif not callable(self.fn):
            raise ValueError(f"{where}: give fn, or per_item and combine, or union_items")
        interval = self.interval or ("bootstrap" if self.additive else "jackknife")
        if interval not in INTERVALS:
            raise ValueError(f"{where}: interval must be one of {', '.join(INTERVALS)}, got {interval!r}")
        if interval == "bootstrap" and not self.additive:
            raise ValueError(f"{where}: a bootstrap interval needs per-item statistics (per_item and combine)")
        object.__setattr__(self, "interval", interval)
        scale = self.jackknife_scale or ("logit" if self.unit_interval else "linear")
        if scale not in ("logit", "linear"):
            raise ValueError(f"{where}: jackknife_scale must be logit or linear, got {scale!r}")
        if scale == "logit" and not self.unit_interval:
            raise ValueError(f"{where}: a logit jackknife_scale needs a value in [0, 1] (unit_interval)")
        object.__setattr__(self, "jackknife_scale", scale)
        object.__setattr__(self, "bounds", _checked_bounds(where, self.bounds, self.unit_interval))
        calibrated = self.calibrated_prompts
        if calibrated is not None and (type(calibrated) is not int or calibrated < 1):
            raise ValueError(f"{where}: calibrated_prompts must be a positive whole number, got {calibrated!r}")

    @property
    def additive(self) -> bool:
        """True when the value combines sums of per-generation statistics."""
        return self.per_item is not None

    def stats(self, cell: CellData) -> np.ndarray | None:
        """An additive metric's per-generation statistics as an (N, k) float array, or None."""
        if self.per_item is None:
            raise TypeError(f"metric {self.name!r} has no per-item statistics")
        raw = self.per_item(cell)
        if raw is None:
            return None
        stats = np.asarray(raw, dtype=float)
        if stats.ndim != 2 or stats.shape[0] != len(cell.texts):
            raise ValueError(
                f"metric {self.name!r}: per_item gave shape {stats.shape}, "
                f"not one row per generation ({len(cell.texts)})"
            )
        return stats


class MetricRegistry(Registry[Metric]):
    """The metric registry, with families: `pass@<k>` names the member k of the family `pass`, made by its
    factory the first time the name is looked up and kept. `names()` and `items()` list the fixed
    entries only (a sweep's default, every metric, has no k); `families()` lists the families."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._families: dict[str, tuple[Callable[[int], Metric], str]] = {}
        self._members: dict[str, Metric] = {}

    def family(self, prefix: str, make: Callable[[int], Metric], description: str) -> None:
        """Register the family `<prefix>@<k>` (k a positive integer), `make(k)` its member."""
        self._families[prefix] = (make, description)

    def families(self) -> list[tuple[str, str]]:
        """(`prefix@<k>`, description) of every family, sorted."""
        return [(f"{p}@<k>", d) for p, (_, d) in sorted(self._families.items())]

    def member(self, name: str) -> Metric | None:
        """The family member `name` names (made once), or None where it names none."""
        if name in self._members:
            return self._members[name]
        prefix, at, k = name.partition("@")
        if not at or prefix not in self._families or not k.isdigit() or k.startswith("0") or len(k) > 6:
            return None
        return self._members.setdefault(name, self._families[prefix][0](int(k)))

    def get(self, name: str) -> Metric:
        if isinstance(name, str) and name not in self._entries and (m := self.member(name)) is not None:
            return m
        return super().get(name)

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or (isinstance(name, str) and self.member(name) is not None)

    def valid_names(self) -> list[str]:
        """The metrics' names, then the families' (`pass@<k>`)."""
        return super().valid_names() + [p for p, _ in self.families()]


METRICS: MetricRegistry = MetricRegistry("metric")


def _checked_bounds(where: str, bounds: object, unit_interval: bool) -> tuple[float | None, float | None]:
    """A metric's `bounds` as (low, high) floats or None; (0, 1) for a unit_interval metric that gave none."""

    def number(end: object) -> bool:
        return isinstance(end, int | float) and not isinstance(end, bool) and math.isfinite(end)

    if not (isinstance(bounds, tuple | list) and len(bounds) == 2 and all(e is None or number(e) for e in bounds)):
        raise ValueError(f"{where}: bounds must be (low, high), each a finite number or None, got {bounds!r}")
    low, high = (None if end is None else float(end) for end in bounds)
    if low is not None and high is not None and not low < high:
        raise ValueError(f"{where}: bounds must have low < high, got {bounds!r}")
    if unit_interval:
        if (low, high) not in ((None, None), (0.0, 1.0)):
            raise ValueError(f"{where}: a unit_interval metric's bounds are (0, 1), got {bounds!r}")
        return 0.0, 1.0
    return low, high


def metric(
    name: str,
    *,
    description: str,
    level: Literal["sequence", "corpus"],
    higher_is_better: bool | None,
    needs_references: bool = False,
    needs_model: bool = False,
    worker_computes: WorkerNeed | None = None,
    interval: Interval = "jackknife",
    citation: str = "",
    unit: str = "",
    leave_one_out: Callable[[CellData, Sequence[Sequence[int]]], np.ndarray] | None = None,
    swap_items: Callable[[CellData, Sequence[Sequence[int]], int], OverlapItems | CountItems | None] | None = None,
    unit_interval: bool = False,
    bounds: tuple[float | None, float | None] = (None, None),
    jackknife_scale: Scale | None = None,
    calibrated_prompts: int | None = None,
    registry: Registry[Metric] = METRICS,
):
    """Decorator: register a plain corpus metric `fn(cell: CellData) -> float | None`.

    Its interval is the delete-one-prompt jackknife ("jackknife", through `leave_one_out`
    where given; on `jackknife_scale`), the delete-half jackknife ("half-sample"), or "none";
    its paired test the permutation test of `swap_items` where given, else the jackknife t-test.
    """
    fields = dict(description=description, level=level, higher_is_better=higher_is_better,
                  needs_references=needs_references, needs_model=needs_model, interval=interval,
                  worker_computes=worker_computes,
                  citation=citation, unit=unit, leave_one_out=leave_one_out, swap_items=swap_items,
                  unit_interval=unit_interval, bounds=bounds, jackknife_scale=jackknife_scale,
                  calibrated_prompts=calibrated_prompts)  # fmt: skip
    return registry.decorator(name, lambda fn: Metric(name=name, fn=fn, **fields))


def union_metric(
    name: str,
    *,
    description: str,
    higher_is_better: bool | None,
    citation: str = "",
    unit: str = "",
    unit_interval: bool = True,
    calibrated_prompts: int | None = None,
    registry: Registry[Metric] = METRICS,
):
    """Decorator: register a union metric from `union_items(cell, groups) -> UnionItems`, each prompt group's
    distinct items and counts (`controller.metrics.unions`): its value |∪ items| / Σ totals over the whole cell,
    its jackknife's exact leave-one-out values (on the logit scale: a share of counted things) and the paired
    swap test all come from them."""
    fields = dict(description=description, level="corpus", higher_is_better=higher_is_better,
                  interval="jackknife", citation=citation, unit=unit, unit_interval=unit_interval,
                  calibrated_prompts=calibrated_prompts)  # fmt: skip
    return registry.decorator(name, lambda items: Metric(name=name, union_items=items, **fields))


def additive_metric(
    name: str,
    *,
    combine: Combine,
    description: str,
    level: Literal["sequence", "corpus"],
    higher_is_better: bool | None,
    needs_references: bool = False,
    needs_model: bool = False,
    needs_answers: bool = False,
    worker_computes: WorkerNeed | None = None,
    interval: Interval = "bootstrap",
    citation: str = "",
    unit: str = "",
    unit_interval: bool = False,
    bounds: tuple[float | None, float | None] = (None, None),
    per_prompt: bool = False,
    outcomes: bool = False,
    calibrated_prompts: int | None = None,
    registry: Registry[Metric] = METRICS,
):
    """Decorator: register `per_item(cell) -> (N, k) array | None` with `combine(sums) -> float | None`.

    The value is `combine` of the k column sums (`math.fsum` each); its interval is a
    studentised bootstrap over prompts from the same statistics ("bootstrap").
    """
    fields = dict(description=description, level=level, higher_is_better=higher_is_better,
                  needs_references=needs_references, needs_model=needs_model, interval=interval,
                  worker_computes=worker_computes, needs_answers=needs_answers,
                  citation=citation, unit=unit, unit_interval=unit_interval, bounds=bounds, per_prompt=per_prompt,
                  outcomes=outcomes, calibrated_prompts=calibrated_prompts)  # fmt: skip
    return registry.decorator(name, lambda per_item: Metric(name=name, per_item=per_item, combine=combine, **fields))


def worker_needs(names: Iterable[str] | None) -> list[WorkerNeed]:
    """What a job's worker must compute for these metrics (None or empty: every registered metric), sorted."""
    selected = list(names or []) or METRICS.names()
    return sorted({need for n in selected if (need := METRICS.get(n).worker_computes) is not None})


def compute_metrics(cell: CellData, names: Iterable[str] | None = None) -> dict[str, float | None]:
    """Every registered metric (or those named) of one cell: name -> value, None where empty."""
    selected = METRICS.names() if names is None else list(names)
    return {name: METRICS.get(name).fn(cell) for name in selected}
