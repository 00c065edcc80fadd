"""The metric registry. Light (no torch): the controller aggregates with it.

A metric is a plain function of a cell's data (`CellData`) returning a float, or None
where it does not apply (a metric that does not apply is empty, never zero).
Every metric carries its metadata; `decodebench metrics` lists them.

Every metric is corpus level: a function of the whole multiset of a cell's
generations, recomputed from the generations at report time. The order of the
generations does not matter (sums of floats use `math.fsum`), so aggregating a cell
from 1 shard or from 4 gives identical values. docs/metrics.md has the formulas.

    cell = cell_data(records)            # GenerationRecord objects or dicts
    values = compute_metrics(cell)       # {"rep_2": 0.01, "bleu": None, ...}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from controller.metrics.tokenize import word_tokenize
from worker.core.registry import Registry


@dataclass
class CellData:
    """Everything the text metrics of one cell (or the reference row) see.

    `words` is `texts` tokenised once with `worker.metrics.tokenize.word_tokenize`,
    the same fixed tokenizer for every cell. Lists are aligned: one entry per generation;
    an optional list that is empty (or holds None) means "absent", and the metrics that
    need it are empty. Build it with `cell_data(records)`.
    """

    texts: list[str]
    words: list[list[str]]
    references: list[str | None] = field(default_factory=list)
    n_new_tokens: list[int] = field(default_factory=list)
    stop_reasons: list[str] = field(default_factory=list)
    nll_sum: list[float | None] = field(default_factory=list)
    nll_count: list[int | None] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class Metric:
    name: str
    description: str
    level: Literal["sequence", "corpus"]
    higher_is_better: bool | None  # None: neither (e.g. mean length, Zipf)
    needs_references: bool
    needs_model: bool
    fn: Callable[[CellData], float | None]
    citation: str = ""
    unit: str = ""


METRICS: Registry[Metric] = Registry("metric")


def metric(
    name: str,
    *,
    description: str,
    level: Literal["sequence", "corpus"],
    higher_is_better: bool | None,
    needs_references: bool = False,
    needs_model: bool = False,
    citation: str = "",
    unit: str = "",
):
    """Decorator: register a quality metric function `fn(cell: CellData) -> float | None`."""
    return METRICS.decorator(
        name,
        lambda fn: Metric(name, description, level, higher_is_better, needs_references, needs_model, fn, citation, unit),
    )


def _field(record: Any, name: str) -> Any:
    """`record[name]` for a mapping, `record.name` otherwise (e.g. a GenerationRecord); None if absent."""
    if isinstance(record, Mapping):
        return record.get(name)
    return getattr(record, name, None)


def _all_or_nothing(values: list[Any]) -> list[Any]:
    """The list if no value is missing, else [] (the metrics that need it are then empty)."""
    return values if all(v is not None for v in values) else []


def cell_data(records: Iterable[Mapping[str, Any] | Any]) -> CellData:
    """Build a cell's `CellData` from its generation records, tokenising each text once.

    `records` are GenerationRecord objects or dicts with its keys (lines of
    generations.jsonl), from any number of shards and seeds in any order: every metric
    is a function of the whole multiset of generations, so order and sharding do not
    change a value. Only `text` is required. `n_new_tokens`, `stop_reason` and
    `token_ids` are kept only when every record has them (otherwise the metrics that
    need them are empty); `reference`, `nll_sum` and `nll_count` stay aligned, with None
    where a record has none.

    The reference row of a prompt set is `cell_data({"text": ref} for ref in refs)`:
    it has no references of its own, so BLEU/ROUGE are empty for it.
    """
    recs = list(records)
    texts = [_field(r, "text") or "" for r in recs]
    return CellData(
        texts=texts,
        words=[word_tokenize(t) for t in texts],
        references=[_field(r, "reference") for r in recs],
        n_new_tokens=_all_or_nothing([_field(r, "n_new_tokens") for r in recs]),
        stop_reasons=_all_or_nothing([_field(r, "stop_reason") for r in recs]),
        nll_sum=[_field(r, "nll_sum") for r in recs],
        nll_count=[_field(r, "nll_count") for r in recs],
        token_ids=_all_or_nothing([_field(r, "token_ids") for r in recs]),
    )


def compute_metrics(cell: CellData, names: Iterable[str] | None = None) -> dict[str, float | None]:
    """Every registered metric (or those named) of one cell: name -> value, None where empty."""
    selected = METRICS.names() if names is None else list(names)
    return {name: METRICS.get(name).fn(cell) for name in selected}


# Importing the metric modules registers their metrics (they import `metric` from here).
from controller.metrics import (  # noqa: E402, F401
    distinct,
    length,
    likelihood,
    reference,
    repetition,
    selfbleu,
    zipf,
)

__all__ = ["METRICS", "CellData", "Metric", "cell_data", "compute_metrics", "metric", "word_tokenize"]
