"""Human ratings, round trip: blinded export, sheets filled with known scores, import, report columns."""

from __future__ import annotations

import csv
import io
import math
import random
from pathlib import Path

import krippendorff
import numpy as np
import pytest
from click.testing import CliRunner

from controller.cli import main
from controller.report.api import build
from controller.report.render.write import render
from tests.support.ratings import export, fill, score
from tests.support.report import make_sweep, write_sweep
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
    assert a["n_controls"] == controls > 0
    assert f"{controls} reference texts of the same prompts mixed in as controls" in out[0]
    assert "warning" not in out[0]
    # the public code's former draw (random.Random(seed) after sampling) does not give the ids
    replay = random.Random(0)
    assert not {f"i{replay.getrandbits(40):010x}" for _ in range(200)} & set(unround(a)["items"])
    warned: list[str] = []
    c = export(store, data, tmp / "c", seed=5, output=warned)
    assert "warning" in warned[0] and c["seed"] == 5
    d = export(store, data, tmp / "d", seed=5)
    assert d["round"] != c["round"] and unround(d) == unround(c)  # reproducible when asked, each its own round
    sheet = lambda key, folder: (tmp / folder / "sheet-r2.html").read_text().replace(f"{key['round']}-i", "i")
    assert sheet(c, "c") == sheet(d, "d")


def unround(key: dict) -> dict:
    """A rating round's key without its round: its item ids without the round's prefix."""
    items = {item.split("-", 1)[1]: where for item, where in key["items"].items()}
    return {**{k: v for k, v in key.items() if k != "round"}, "items": items}


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
    # the cells whose items were not all given one score (alpha needs variation; an interval has width either way)
    scores: dict[str, set[int]] = {}
    for item, where in key["items"].items():
        scores.setdefault(where["cell"], set()).add(by_item("r1", item, "fluency"))
    varied = summary[summary["cell"].map(lambda cell: len(scores.get(cell, ())) > 1)]
    assert len(varied) and varied["rating_fluency_alpha"].tolist() == pytest.approx([1.0] * len(varied))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rows: rows[1].__setitem__(0, "ideadbeef00"), "row 2, column item: unknown item 'ideadbeef00'"),
        (lambda rows: rows[2].__setitem__(4, "6"), "row 3, column fluency: score '6' is not one of 1-5"),
        (lambda rows: rows[2].__setitem__(5, "0"), "row 3, column coherence: score '0' is not one of 1-5"),
        (lambda rows: rows[2].__setitem__(4, "²"), "row 3, column fluency: score '²' is not one of 1-5"),
        (lambda rows: rows[2].__setitem__(4, "٣"), "row 3, column fluency: score '٣' is not one of 1-5"),
        (lambda rows: rows[2].__setitem__(5, "4.0"), "row 3, column coherence: score '4.0' is not one of 1-5"),
        (lambda rows: rows.append(list(rows[1])), "column item: duplicate row for item"),
        (lambda rows: rows[3].__setitem__(1, ""), "row 4, column rater: missing rater"),
        (
            lambda rows: rows[3].__setitem__(1, "r1"),
            "row 4, column rater: rater 'r1', but this file is r2's sheet (row 2)",
        ),
        (lambda rows: [r.append(r[4]) for r in rows], "row 1, column 7: the header names 'fluency' twice"),
    ],
    ids=[
        "item",
        "six",
        "zero",
        "superscript",
        "arabic-digit",
        "decimal",
        "duplicate",
        "no-rater",
        "other-rater",
        "column-twice",
    ],
)
def test_bad_sheets_are_refused_and_nothing_imported_is_lost(sweep, edit, message):
    store, data, tmp = sweep
    export(store, data, tmp / "s")
    good = tmp / "r1.csv"
    good.write_bytes(fill(tmp / "s" / "sheet-r1.csv", "r1"))
    assert run(store, "rate", "import", data.sweep_id, str(good)).exit_code == 0
    before = store.read_json(paths.rater_sheet_key(data.tenant, data.sweep_id, "1", "r1"))
    rows = list(csv.reader(io.StringIO(fill(tmp / "s" / "sheet-r2.csv", "r2").decode())))
    edit(rows)
    bad = tmp / "r2.csv"
    bad.write_text("".join(",".join(f'"{v}"' for v in row) + "\n" for row in rows))
    res = CliRunner().invoke(main, ["rate", "import", data.sweep_id, str(good), str(bad), "--store", store.url])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and message in lines[0], res.output
    assert store.read_json(paths.rater_sheet_key(data.tenant, data.sweep_id, "1", "r1")) == before
    assert not store.exists(paths.rater_sheet_key(data.tenant, data.sweep_id, "1", "r2"))


def test_too_few_items_for_the_cells_is_a_usage_error(sweep):
    store, data, tmp = sweep
    res = CliRunner().invoke(
        main, ["rate", "export", data.sweep_id, "--items", "2", "--raters", "2", "--store", store.url]
    )
    assert res.exit_code == 2 and "every cell must be rated" in res.output


def sheet_items(path: Path) -> int:
    """Items of an exported sheet (a secret draw: how many references join as controls varies)."""
    return len(list(csv.DictReader(io.StringIO(path.read_text()))))


def import_(store, data, *files: Path):
    return CliRunner().invoke(main, ["rate", "import", data.sweep_id, *map(str, files), "--store", store.url])


def test_import_says_what_it_replaced_and_what_to_run_next(sweep):
    store, data, tmp = sweep
    export(store, data, tmp / "s")
    first = tmp / "first.csv"
    first.write_bytes(fill(tmp / "s" / "sheet-r1.csv", "r1"))
    res = import_(store, data, first)
    assert res.exit_code == 0, res.output
    n = sheet_items(tmp / "s" / "sheet-r1.csv")
    assert (
        f"r1: {n} items of round 1\n" in res.output
        and f"next: decodebench report {data.sweep_id} --store" in res.output
    )
    again = import_(store, data, tmp / "s" / "sheet-r1.csv")  # the blank sheet, returned by mistake
    assert f"r1: {n} items of round 1 (replaces the sheet imported from " + str(first) + ")" in again.output


def test_a_file_named_for_one_rater_may_not_carry_another(sweep):
    store, data, tmp = sweep
    export(store, data, tmp / "s")
    forged = tmp / "sheet-r1.csv"  # r1's file name, r2's rows
    forged.write_bytes(fill(tmp / "s" / "sheet-r2.csv", "r2"))
    res = import_(store, data, forged)
    assert (
        res.exit_code == 2
        and "row 2, column rater: rater 'r2', but this file is r1's sheet (its file name)" in res.output
    )
    assert not store.exists(paths.rater_sheet_key(data.tenant, data.sweep_id, "1", "r2"))


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig"])
def test_sheets_in_the_encodings_of_prompt_files_import(sweep, encoding):
    store, data, tmp = sweep
    export(store, data, tmp / "s")
    sheet = tmp / "r1.csv"
    sheet.write_bytes(fill(tmp / "s" / "sheet-r1.csv", "r1").decode().encode(encoding))  # as spreadsheets save
    res = import_(store, data, sheet)
    assert res.exit_code == 0, res.output
    exported = sheet_items(tmp / "s" / "sheet-r1.csv")
    assert len(store.read_json(paths.rater_sheet_key(data.tenant, data.sweep_id, "1", "r1"))["scores"]) == exported


def test_utf16_without_a_bom_and_latin1_are_one_line(sweep):
    store, data, tmp = sweep
    export(store, data, tmp / "s")
    text = fill(tmp / "s" / "sheet-r1.csv", "r1").decode()
    (tmp / "a.csv").write_bytes(text.encode("utf-16-le"))
    (tmp / "b.csv").write_bytes(text.encode() + "café".encode("latin-1"))
    for name, expected in (("a.csv", "a NUL byte at byte 1"), ("b.csv", "not UTF-8 text at byte")):
        res = import_(store, data, tmp / name)
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and expected in lines[0], res.output


def test_a_sheet_over_the_size_limit_is_refused_before_it_is_read(sweep, monkeypatch):
    store, data, tmp = sweep
    export(store, data, tmp / "s")
    big = tmp / "big.csv"
    with big.open("wb") as f:
        f.write(fill(tmp / "s" / "sheet-r1.csv", "r1"))
        f.truncate(2 * 2**20 + 1)  # sparse: 2 MiB without writing them
    monkeypatch.setenv("DECODEBENCH_RATING_SHEET_MAX_MB", "2")
    res = import_(store, data, big)
    assert res.exit_code == 2 and "over the limit of 2 MiB for a rating sheet" in res.output, res.output


def test_a_pipe_or_device_over_the_limit_is_refused_without_reading_it_whole(sweep, monkeypatch):
    """A device or pipe reports size 0: /dev/zero passed the size check and was read until memory ran out."""
    store, data, _ = sweep
    monkeypatch.setenv("DECODEBENCH_RATING_SHEET_MAX_MB", "1")
    res = import_(store, data, Path("/dev/zero"))
    assert res.exit_code == 2 and "more than 1,048,577 bytes, over the limit of 1 MiB" in res.output, res.output


def test_a_sheet_of_its_header_alone_says_it_has_no_rows(sweep):
    store, data, tmp = sweep
    export(store, data, tmp / "s")
    empty = tmp / "sheet-r1.csv"
    empty.write_text((tmp / "s" / "sheet-r1.csv").read_text().splitlines()[0] + "\n")
    res = import_(store, data, empty)
    assert res.exit_code == 2 and "no rated rows" in res.output and "round" not in res.output, res.output


def test_the_python_summary_shows_the_ratings_imported_since_the_report(sweep):
    """load_summary read the stored summary.parquet while its jobs were all counted: ratings imported after the
    report were missing from it, or stale, until the next report."""
    from controller.report.api import load_summary

    store, data, tmp = sweep
    assert run(store, "report", data.sweep_id, "--no-progress", "--n-boot", "200").exit_code == 0
    assert not any(c.startswith("rating_") for c in load_summary(data.sweep_id, store=store).columns)
    export(store, data, tmp / "s")
    for rater in ("r1", "r2", "r3"):
        (tmp / f"sheet-{rater}.csv").write_bytes(fill(tmp / "s" / f"sheet-{rater}.csv", rater))
        assert import_(store, data, tmp / f"sheet-{rater}.csv").exit_code == 0
    cached = load_summary(data.sweep_id, store=store)
    fresh = load_summary(data.sweep_id, store=store, recompute=True, n_boot=200)
    assert cached["rating_fluency"].tolist() == pytest.approx(fresh["rating_fluency"].tolist(), nan_ok=True)


def test_export_says_what_was_added_and_defines_each_criterion(sweep):
    store, data, tmp = sweep
    res = run(store, "rate", "export", data.sweep_id, "--items", "7", "--raters", "2", "--criteria",
              "fluency,coherence,wit", "--define", "wit=Is it witty?", "--out", str(tmp / "s"))  # fmt: skip
    assert res.exit_code == 0, res.output
    key = store.read_json(paths.rating_round_key(data.tenant, data.sweep_id, "1", paths.RATINGS_KEY_FILE))
    controls = sum(1 for w in key["items"].values() if w["cell"] == "reference")
    assert controls > 0
    assert (
        f"rating round 1: {len(key['items'])} items for 2 raters in {tmp / 's'}/: 7 generations over 3 cells, "
        f"and {controls} reference texts of the same prompts mixed in as controls"
    ) in res.output
    assert f"next: send each rater their sheet; then decodebench rate import {data.sweep_id} FILES..." in res.output
    text = (tmp / "s" / "instructions.txt").read_text()
    assert "fluency: Is the text well-formed language" in text and "coherence: Does the text hang together" in text
    assert "wit: Is it witty?" in text and "1 = very poor" in text
    page = (tmp / "s" / "sheet-r1.html").read_text()
    assert "<dt>fluency</dt><dd>Is the text well-formed language" in page and "<dt>wit</dt><dd>Is it witty?" in page


def test_the_ratings_table_counts_items_and_marks_alpha_on_too_few(sweep):
    store, data, tmp = sweep
    export(store, data, tmp / "s", raters=2)
    files = []
    for r in ("r1", "r2"):
        (tmp / f"{r}.csv").write_bytes(fill(tmp / "s" / f"sheet-{r}.csv", r))
        files.append(str(tmp / f"{r}.csv"))
    assert run(store, "rate", "import", data.sweep_id, *files).exit_code == 0
    loaded, summary = build(store, data.tenant, data.sweep_id, n_boot=0)
    rated = summary[summary["rating_fluency_n"].notna()]
    n = sheet_items(tmp / "s" / "sheet-r1.csv")
    assert rated["rating_fluency_n"].sum() == n and (rated["rating_fluency_n"] < 10).all()
    defined = rated[rated["rating_fluency_alpha"].notna()]
    assert len(defined)  # α with its interval around it, where the bootstrap defines one
    assert defined["rating_fluency_alpha_ci_low"].notna().any()
    for _, row in defined[defined["rating_fluency_alpha_ci_low"].notna()].iterrows():
        assert row["rating_fluency_alpha_ci_low"] <= row["rating_fluency_alpha"] <= row["rating_fluency_alpha_ci_high"]
    md = render("md", summary, loaded).decode()
    section = md.split("## Human ratings", 1)[1]
    assert " · n 2 · α " in section or " · n 3 · α " in section or " · n 4 · α " in section
    assert "(too few items)" in section and "below 10 items" in section


def test_each_export_is_a_round_of_its_own_whose_sheets_import_and_pool(sweep):
    """A second `rate export` is round 2 beside round 1 (issue 39: it replaced round 1's key, and the sheets
    already sent out could no longer be imported); both rounds' sheets import, the report pools them, and a
    sheet of a round never exported is one line naming it."""
    store, data, tmp = sweep
    first = export(store, data, tmp / "one", raters=2)
    second = CliRunner().invoke(main, ["rate", "export", data.sweep_id, "--items", "7", "--raters", "2",
                                       "--out", str(tmp / "two"), "--store", store.url])  # fmt: skip
    assert second.exit_code == 0 and "rating round 2:" in second.output, second.output
    key1 = store.read_json(paths.rating_round_key(data.tenant, data.sweep_id, "1", paths.RATINGS_KEY_FILE))
    assert key1 == first  # round 1's key is untouched
    key2 = store.read_json(paths.rating_round_key(data.tenant, data.sweep_id, "2", paths.RATINGS_KEY_FILE))
    assert not set(first["items"]) & set(key2["items"])
    files = []
    for folder in ("one", "two"):
        for r in ("r1", "r2"):
            path = tmp / f"{folder}-{r}.csv"
            path.write_bytes(fill(tmp / folder / f"sheet-{r}.csv", r))
            files.append(str(path))
    res = run(store, "rate", "import", data.sweep_id, *files)
    assert res.exit_code == 0 and "of round 1" in res.output and "of round 2" in res.output, res.output
    _, summary = build(store, data.tenant, data.sweep_id, n_boot=0)
    pooled = {**first["items"], **key2["items"]}
    for _, row in summary.iterrows():
        items = [i for i, v in pooled.items() if v["cell"] == row["cell"]]
        scores = [score(r, i, "fluency") for r in ("r1", "r2") for i in items]
        assert row["rating_fluency"] == pytest.approx(np.mean(scores))
        assert row["rating_fluency_n"] == len(items)
    stray = tmp / "stray.csv"
    stray.write_text((tmp / "one-r1.csv").read_text().replace("1-i", "7-i"))
    res = import_(store, data, stray)
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert f"its items are of rating round '7', which sweep {data.sweep_id} never exported (rounds: 1, 2)" in res.output
