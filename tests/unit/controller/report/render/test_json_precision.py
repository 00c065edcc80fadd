"""summary.json and a comparison's JSON keep every float as the summary holds it (docs/reports.md: "CSV, Parquet
and JSON keep the full values")."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from controller.report.compute.aggregate import summarize
from controller.report.render.write import comparison_bytes, render
from tests.support.report import make_sweep


def _same(frame: pd.DataFrame, rows: list[dict]) -> None:
    assert len(rows) == len(frame)
    for row, (_, want) in zip(rows, frame.iterrows()):
        for column, value in want.items():
            got = row[column]
            if value is pd.NA:
                assert got is None, column
            elif isinstance(value, float | np.floating):
                assert got is None if not math.isfinite(value) else got == float(value), column
            else:
                assert got == (value.item() if hasattr(value, "item") else value), column


def test_summary_json_holds_each_float_to_the_bit():
    """pandas' to_json(double_precision=15) rounds to 15 decimal places: a p of 4.696894622322827e-10 was written
    4.69689e-10, and Holm recomputed from the file's p-values disagreed with its own in 121 of 216 cells."""
    data = make_sweep(n_prompts=8)
    summary = summarize(data, n_boot=100)
    summary.loc[summary.index[0], "mean_length"] = 4.696894622322827e-10
    doc = json.loads(render("json", summary, data))
    assert doc["rows"][0]["mean_length"] == 4.696894622322827e-10
    _same(summary, doc["rows"])
    comparison = pd.DataFrame({"metric": ["bleu", "rep_2"], "delta": [1.0059571091747113e-07, math.nan]})
    assert json.loads(comparison_bytes("json", comparison)) == [
        {"metric": "bleu", "delta": 1.0059571091747113e-07},
        {"metric": "rep_2", "delta": None},
    ]
