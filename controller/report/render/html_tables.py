"""report.html's reference tables: the metrics' glossary and the provenance of the complete jobs."""

from __future__ import annotations

import html
import json
from collections import defaultdict
from typing import Any

import pandas as pd

from controller.metrics import METRICS
from controller.report.load.sweep import SweepData
from controller.report.render.format import metric_columns

e = html.escape


def _flatten(d: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(d, dict):
        out: dict[str, str] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(d, sort_keys=True) if isinstance(d, (list, tuple)) else str(d)}


def provenance(data: SweepData) -> str:
    values: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in data.results:
        for k, v in _flatten({k: v for k, v in r.provenance.items() if k != "seed"}).items():
            values[k][v].add(r.job.model.label)
    rows = []
    for key in sorted(values):
        shown = "; ".join(
            f"{v} ({', '.join(sorted(models))})" if len(values[key]) > 1 else v
            for v, models in sorted(values[key].items())
        )
        rows.append(f'<tr><td class="t">{e(key)}</td><td class="t w">{e(shown)}</td></tr>')
    return (
        f'<table><thead><tr><th class="t">key</th><th class="t">values (models, where they differ)</th></tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def metrics_glossary(summary: pd.DataFrame) -> str:
    rows = []
    for name in metric_columns(summary):
        if name not in METRICS:
            continue
        m = METRICS.get(name)
        better = {True: "higher", False: "lower", None: "neither"}[m.higher_is_better]
        rows.append(
            f'<tr><td class="t">{e(name)}</td><td class="t w">{e(m.description)}</td><td class="t">{better}</td>'
            f'<td class="t w">{e(m.citation)}</td></tr>'
        )
    return (
        '<table><thead><tr><th class="t">metric</th><th class="t">meaning</th><th class="t">better</th>'
        f'<th class="t">source</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
