"""Quality metrics: a cell's data (`cell`), the registry (`registry`) and one module per family of metrics.

Importing this package registers every metric. Light (no torch): the controller
aggregates with it. How a metric declares its aggregation and interval:
`controller.metrics.registry` and docs/metrics.md.

    cell = cell_data(records)            # GenerationRecord objects or dicts
    values = compute_metrics(cell)       # {"rep_2": 0.01, "bleu": None, ...}
"""

from controller.metrics import (  # noqa: F401
    answers,
    distinct,
    divergence,
    length,
    likelihood,
    reference,
    repetition,
    selfbleu,
    zipf,
)
from controller.metrics.cell import CellData, cell_data
from controller.metrics.counts import CountItems
from controller.metrics.overlaps import OverlapItems
from controller.metrics.registry import (
    INTERVALS,
    METRICS,
    Interval,
    Metric,
    additive_metric,
    column_sums,
    compute_metrics,
    item_rows,
    metric,
    ratio,
    union_metric,
)
from controller.metrics.tokenize import word_tokenize
from controller.metrics.unions import UnionItems

__all__ = [
    "INTERVALS",
    "METRICS",
    "CellData",
    "CountItems",
    "Interval",
    "Metric",
    "additive_metric",
    "cell_data",
    "column_sums",
    "compute_metrics",
    "item_rows",
    "metric",
    "OverlapItems",
    "ratio",
    "UnionItems",
    "union_metric",
    "word_tokenize",
]
