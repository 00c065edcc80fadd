"""Human ratings as a test fills them: a round exported with `decodebench rate export`, sheets filled with
known scores (deterministic, different per rater, item and criterion)."""

from __future__ import annotations

import csv
import io

from click.testing import CliRunner

from controller.cli import main
from controller.report.ratings.scores import rounds


def export(store, data, out, items=7, raters=3, seed=None, output=None):
    extra = [] if seed is None else ["--seed", str(seed)]
    res = CliRunner().invoke(main, ["rate", "export", data.sweep_id, "--items", str(items), "--raters", str(raters),
                                    "--criteria", "fluency,coherence", "--out", str(out), *extra,
                                    "--store", store.url], catch_exceptions=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    if output is not None:
        output.append(res.output)
    return list(rounds(store, data.tenant, data.sweep_id).values())[-1]  # the key of the round just exported


def score(rater: str, item: str, criterion: str) -> int:
    """Known scores: deterministic, different per rater, item and criterion."""
    return 1 + (sum(map(ord, rater + item + criterion)) % 5)


def fill(path, rater, scorer=score) -> bytes:
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "fluency": scorer(rater, row["item"], "fluency"),
                         "coherence": scorer(rater, row["item"], "coherence")})  # fmt: skip
    return buf.getvalue().encode()
