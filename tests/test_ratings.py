"""Human ratings, round trip: blinded export, sheets filled with known scores, import, report columns."""

from __future__ import annotations

import csv
import io
import math
import random

import krippendorff
import numpy as np
import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.report.write import build, render
from tests.helpers_report import make_sweep, write_sweep
from worker.core import paths
from worker.store import FileStore

CELLS = [("austen-tiny", "greedy", {}), ("austen-tiny", "top_p", {"p": 0.9}), ("austen-small", "greedy", {})]
HIDDEN = ["austen-tiny", "austen-small", "greedy", "top_p", "::", "/models/"]


@pytest.fixture()
def sweep(tmp_path):
    store = FileStore(tmp_path / "store")
    data = make_sweep(n_prompts=6, cells=CELLS)
    write_sweep(store, data)
    return store, data, tmp_path


def run(store, *args):
    return CliRunner().invoke(main, [*args, "--store", store.url], catch_exceptions=False)


def export(store, data, out, items=7, raters=3, seed=None, output=None):
    extra = [] if seed is None else ["--seed", str(seed)]
    res = CliRunner().invoke(main, ["rate", "export", data.sweep_id, "--items", str(items), "--raters", str(raters),
                                    "--criteria", "fluency,coherence", "--out", str(out), *extra,
                                    "--store", store.url], catch_exceptions=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    if output is not None:
        output.append(res.output)
    return store.read_json(paths.ratings_key(data.tenant, data.sweep_id, paths.RATINGS_KEY_FILE))


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


def test_export_is_blinded_stratified_reproducible_and_shuffled(sweep):
    store, data, tmp = sweep
    key = export(store, data, tmp / "a")
    cells = {v["cell"] for v in key["items"].values()}
    assert cells == {g.cell for g in data.generations} | {"reference"}  # every cell rated, references as control
    assert sum(v["cell"] != "reference" for v in key["items"].values()) == 7
    for f in sorted((tmp / "a").iterdir()):
        body = f.read_text()
        assert not [h for h in HIDDEN if h in body], f.name  # no model, strategy or cell, HTML source included
    orders = [[r["item"] for r in csv.DictReader((tmp / "a" / f"sheet-r{i}.csv").open())] for i in (1, 2, 3)]
    assert sorted(orders[0]) == sorted(orders[1]) == sorted(key["items"]) and orders[0] != orders[1]
    assert key["seed"] is None  # a secret draw by default


def test_default_exports_are_secret_and_seeded_ones_reproducible_with_a_warning(sweep):
    store, data, tmp = sweep
    out: list[str] = []
    a, b = export(store, data, tmp / "a", output=out), export(store, data, tmp / "b")
    assert not set(a["items"]) & set(b["items"])  # fresh ids every export: nothing to replay
    controls = sum(v["cell"] == "reference" for v in a["items"].values())
    assert a["n_controls"] == controls > 0 and f"({controls} of them references mixed in as controls)" in out[0]
    assert "warning" not in out[0]
    # the public code's former draw (random.Random(seed) after sampling) does not give the ids
    replay = random.Random(0)
    assert not {f"i{replay.getrandbits(40):010x}" for _ in range(200)} & set(a["items"])
    warned: list[str] = []
    c = export(store, data, tmp / "c", seed=5, output=warned)
    assert "warning" in warned[0] and c["seed"] == 5
    assert export(store, data, tmp / "d", seed=5) == c  # reproducible when asked
    assert (tmp / "c" / "sheet-r2.html").read_bytes() == (tmp / "d" / "sheet-r2.html").read_bytes()


def test_round_trip_means_and_alpha_equal_direct_computations(sweep):
    store, data, tmp = sweep
    key = export(store, data, tmp / "s")
    files = []
    for r in ("r1", "r2", "r3"):
        (tmp / f"{r}.csv").write_bytes(fill(tmp / "s" / f"sheet-{r}.csv", r))
        files.append(str(tmp / f"{r}.csv"))
    res = run(store, "rate", "import", data.sweep_id, *files)
    assert res.exit_code == 0, res.output
    _, summary = build(store, data.tenant, data.sweep_id, n_boot=0)
    for _, row in summary.iterrows():
        items = [i for i, v in key["items"].items() if v["cell"] == row["cell"]]
        for c in ("fluency", "coherence"):
            matrix = np.array([[score(r, i, c) for i in items] for r in ("r1", "r2", "r3")], dtype=float)
            assert row[f"rating_{c}"] == pytest.approx(matrix.mean())
            assert row[f"rating_{c}_ci_low"] <= row[f"rating_{c}"] <= row[f"rating_{c}_ci_high"]
            direct = krippendorff.alpha(
                reliability_data=matrix, level_of_measurement="ordinal", value_domain=[1, 2, 3, 4, 5]
            )
            if np.isfinite(direct):
                assert row[f"rating_{c}_alpha"] == pytest.approx(direct)
            else:
                assert math.isnan(row[f"rating_{c}_alpha"])
    assert summary["rating_fluency"].notna().all()  # every cell and the reference row
    assert "## Human ratings" in render("md", summary, data).decode()
    assert 'id="ratings"' in render("html", summary, data).decode()


def test_perfect_agreement_gives_alpha_one(sweep):
    store, data, tmp = sweep
    key = export(store, data, tmp / "s", raters=2)
    by_item = lambda rater, item, c: 1 + (sum(map(ord, item)) % 5)  # every rater agrees
    files = []
    for r in ("r1", "r2"):
        (tmp / f"{r}.csv").write_bytes(fill(tmp / "s" / f"sheet-{r}.csv", r, by_item))
        files.append(str(tmp / f"{r}.csv"))
    assert run(store, "rate", "import", data.sweep_id, *files).exit_code == 0
    _, summary = build(store, data.tenant, data.sweep_id, n_boot=0)
    assert len(key["items"]) > 0
    varied = summary[summary["rating_fluency_ci_high"] > summary["rating_fluency_ci_low"]]
    assert len(varied) and varied["rating_fluency_alpha"].tolist() == pytest.approx([1.0] * len(varied))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rows: rows[1].__setitem__(0, "ideadbeef00"), "row 2: unknown item 'ideadbeef00'"),
        (lambda rows: rows[2].__setitem__(4, "6"), "row 3: fluency score '6' is outside 1-5"),
        (lambda rows: rows[2].__setitem__(5, "0"), "row 3: coherence score '0' is outside 1-5"),
        (lambda rows: rows.append(list(rows[1])), "duplicate row for item"),
        (lambda rows: rows[3].__setitem__(1, ""), "row 4: missing rater"),
    ],
)
def test_bad_sheets_are_refused_and_nothing_imported_is_lost(sweep, edit, message):
    store, data, tmp = sweep
    export(store, data, tmp / "s")
    good = tmp / "r1.csv"
    good.write_bytes(fill(tmp / "s" / "sheet-r1.csv", "r1"))
    assert run(store, "rate", "import", data.sweep_id, str(good)).exit_code == 0
    before = store.read_json(paths.rater_sheet_key(data.tenant, data.sweep_id, "r1"))
    rows = list(csv.reader(io.StringIO(fill(tmp / "s" / "sheet-r2.csv", "r2").decode())))
    edit(rows)
    bad = tmp / "r2.csv"
    bad.write_text("".join(",".join(f'"{v}"' for v in row) + "\n" for row in rows))
    res = CliRunner().invoke(main, ["rate", "import", data.sweep_id, str(good), str(bad), "--store", store.url])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and message in lines[0], res.output
    assert store.read_json(paths.rater_sheet_key(data.tenant, data.sweep_id, "r1")) == before
    assert not store.exists(paths.rater_sheet_key(data.tenant, data.sweep_id, "r2"))


def test_too_few_items_for_the_cells_is_a_usage_error(sweep):
    store, data, tmp = sweep
    res = CliRunner().invoke(
        main, ["rate", "export", data.sweep_id, "--items", "2", "--raters", "2", "--store", store.url]
    )
    assert res.exit_code == 2 and "every cell must be rated" in res.output
