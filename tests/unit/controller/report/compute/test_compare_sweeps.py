"""`report A --compare B`: two sweeps on the same prompts are compared paired over them, cell by cell, with
intervals and Holm's p over the table; sweeps whose prompts differ keep the plain differences, untested."""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

import tests.support.report as synthetic
from controller.cli import main
from controller.report.api import compare_sweeps
from controller.report.render.comparisons import COMPARE_NOTE, PAIRED_NOTE, untested_note
from controller.report.render.format import compare_table
from controller.report.stats.paired import SUFFIXES
from tests.support.report import make_sweep, write_sweep
from worker.store import FileStore

pytestmark = pytest.mark.pure

A, B = "sweepaaaaaaaaaaa", "sweepbbbbbbbbbbb"
LOOP = "the cat sat the cat sat the cat sat the cat sat"


def sweeps(tmp_path) -> FileStore:
    """Sweep A, and sweep B on the same 16 prompts, two seeds, whose top_p cell loops on every prompt."""
    store = FileStore(tmp_path)
    a, b = (make_sweep(n_prompts=16, seeds=(0, 1), sweep_id=s) for s in (A, B))
    for i, g in enumerate(b.generations):
        if g.strategy == "top_p":
            b.generations[i] = g.model_copy(update={"text": LOOP})
    write_sweep(store, a)
    write_sweep(store, b)
    return store


def by_strategy(comparison: pd.DataFrame, strategy: str) -> pd.Series:
    return comparison[comparison["strategy"] == strategy].iloc[0]


def test_sweeps_on_the_same_prompts_are_compared_paired_cell_by_cell(tmp_path):
    store = sweeps(tmp_path)
    cmp = compare_sweeps(A, B, store=store, n_boot=200)
    greedy, top_p = by_strategy(cmp, "greedy"), by_strategy(cmp, "top_p")
    assert greedy["paired_prompts"] == top_p["paired_prompts"] == 16
    assert (greedy["cell_a"], greedy["cell_b"]) == ("austen-tiny::greedy", "austen-tiny::greedy")
    # B's top_p loops: more repeated bigrams, fewer distinct ones, found by the paired test over the table
    assert top_p["rep_2_diff"] == pytest.approx(top_p["rep_2_delta"]) and top_p["rep_2_diff"] > 0.3
    assert 0 < top_p["rep_2_diff_ci_low"] < top_p["rep_2_diff"] < top_p["rep_2_diff_ci_high"]
    assert top_p["rep_2_diff_p_holm"] < 0.05 and top_p["distinct_2_diff_p_holm"] < 0.05
    # greedy is the same in both sweeps: no difference, none found
    assert greedy["rep_2_diff"] == 0 and greedy["rep_2_diff_ci_low"] <= 0 <= greedy["rep_2_diff_ci_high"]
    assert greedy["rep_2_diff_p_holm"] == 1.0
    # Holm over every p of the table: the adjusted p is at least the raw one, and not below it times 1
    tested = [(r, c) for _, r in cmp.iterrows() for c in cmp.columns if c.endswith("_diff_p") and pd.notna(r[c])]
    assert len(tested) > 10 and all(r[f"{c}_holm"] >= r[c] for r, c in tested)
    assert pd.isna(by_strategy(cmp, "reference")["paired_prompts"])  # the prompt set's references: not a cell


def test_the_terminal_table_marks_what_the_paired_test_finds(tmp_path):
    sweeps(tmp_path)
    argv = ["report", A, "--compare", B, "--store", str(tmp_path), "--no-progress", "--n-boot", "200"]
    result = CliRunner().invoke(main, [*argv, "--format", "csv", "--output", str(tmp_path / "cmp.csv")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    greedy = next(line for line in lines if "| greedy |" in line)
    top_p = next(line for line in lines if "| top_p |" in line)
    cells = dict(zip(header, (c.strip() for c in top_p.strip("|").split("|"))))
    assert cells["Δ diversity"].endswith("*") and cells["Δ diversity"].startswith("-")
    assert "*" not in greedy and PAIRED_NOTE.strip() in result.stdout
    written = pd.read_csv(tmp_path / "cmp.csv")
    assert {"paired_prompts", "cell_a", "cell_b", *(f"rep_2{s}" for s in SUFFIXES)} <= set(written.columns)


def test_sweeps_whose_prompts_differ_are_not_paired(tmp_path, monkeypatch):
    """The same prompt ids with other texts: a pairing over them would compare different prompts."""
    store = FileStore(tmp_path)
    write_sweep(store, make_sweep(n_prompts=16, sweep_id=A))
    other = lambda n, refs=True: [p.model_copy(update={"prompt": f"Another {p.id}"}) for p in prompts(n, refs)]
    prompts = synthetic.prompts
    monkeypatch.setattr(synthetic, "prompts", other)
    write_sweep(store, make_sweep(n_prompts=16, sweep_id=B))
    cmp = compare_sweeps(A, B, store=store, n_boot=200)
    assert "paired_prompts" not in cmp.columns and not any(c.endswith("_diff_p") for c in cmp.columns)
    assert by_strategy(cmp, "greedy")["rep_2_delta"] == 0  # the plain differences stay
    assert by_strategy(cmp, "greedy")["tokens_per_s_delta"] == 0
    assert compare_table(cmp).endswith(COMPARE_NOTE)


def test_without_intervals_the_comparison_is_the_plain_differences(tmp_path):
    store = sweeps(tmp_path)
    cmp = compare_sweeps(A, B, store=store, n_boot=0)
    assert "paired_prompts" not in cmp.columns and by_strategy(cmp, "top_p")["rep_2_delta"] > 0.3
    assert compare_table(cmp).endswith(COMPARE_NOTE)


def test_a_sweep_of_one_seed_against_one_of_three_compares_corpus_metrics_on_first_generations(tmp_path):
    """distinct-n falls as a cell grows: B's three seeds have fewer distinct bigrams than A's one for that alone.
    Paired on each prompt's first generation (the same texts in both), the difference is none."""
    store = FileStore(tmp_path)
    write_sweep(store, make_sweep(n_prompts=16, seeds=(0,), sweep_id=A))
    write_sweep(store, make_sweep(n_prompts=16, seeds=(0, 1, 2), sweep_id=B))
    cmp = compare_sweeps(A, B, store=store, n_boot=200)
    top_p = by_strategy(cmp, "top_p")
    assert top_p["distinct_2_delta"] < -0.1 and top_p["distinct_2_diff"] == 0 and top_p["distinct_2_diff_p_holm"] == 1
    assert "distinct_2" in top_p["first_generation_diffs"].split()
    row = next(line for line in compare_table(cmp).splitlines() if "| top_p |" in line)
    assert " †" in row


def test_cells_over_different_prompt_sets_are_not_paired(tmp_path):
    """B ran the first 16 prompts and 8 more: its cells' values are over 24, so a difference over the 16 alone would
    not be the difference shown. Not tested; the note says so."""
    store = FileStore(tmp_path)
    write_sweep(store, make_sweep(n_prompts=16, sweep_id=A))
    write_sweep(store, make_sweep(n_prompts=24, sweep_id=B))
    cmp = compare_sweeps(A, B, store=store, n_boot=200)
    assert cmp["paired_prompts"].isna().all() and cmp["rep_2_diff_p_holm"].isna().all()
    table = compare_table(cmp)  # before, the note said no two cells held the same prompts: they hold 16 alike
    assert "the sweeps hold 16 prompts alike, but A has 16 and B 24" in table and "same file and limit" in table
    assert table.endswith(untested_note({"a": 16, "b": 24, "alike": 16})) and not table.endswith(COMPARE_NOTE)


def one_model_sweeps(tmp_path, a_models=("x",), b_models=("y",)) -> FileStore:
    """Sweeps A and B, each of greedy and top_p on its own models, on the same 16 prompts."""
    store = FileStore(tmp_path)
    for sweep_id, models in ((A, a_models), (B, b_models)):
        cells = [(m, s, p) for m in models for s, p in (("greedy", {}), ("top_p", {"p": 0.9}))]
        write_sweep(store, make_sweep(n_prompts=16, sweep_id=sweep_id, cells=cells))
    return store


def test_two_sweeps_of_one_model_each_pair_their_models(tmp_path):
    """A sweep run again with another model: its cells are the other's, model x's against model y's. Before, no
    cell matched (`present` a or b) and nothing was compared."""
    store = one_model_sweeps(tmp_path)
    cmp = compare_sweeps(A, B, store=store, n_boot=200)
    cells = cmp[cmp["strategy"] != "reference"]
    assert list(cells["present"]) == ["both", "both"] and list(cells["model"]) == ["x → y", "x → y"]
    assert list(cells["cell_a"]) == ["x::greedy", "x::top_p(p=0.9)"] and (cells["paired_prompts"] == 16).all()
    assert "| x → y | greedy | both |" in compare_table(cmp)


def test_models_pairs_the_models_of_several_model_sweeps_as_told(tmp_path):
    store = one_model_sweeps(tmp_path, ("x", "z"), ("y", "z"))
    untold = compare_sweeps(A, B, store=store, n_boot=0)
    assert sorted(untold["present"]) == ["a", "a", "b", "b", "both", "both", "both"]  # z's match, and the reference
    told = compare_sweeps(A, B, store=store, n_boot=0, models=["x=y"])
    assert sorted(told["present"]) == ["both"] * 5
    assert sorted(set(told["model"].dropna())) == ["x → y", "z"]


@pytest.mark.parametrize(
    "given,expected",
    [
        (["x=nope"], "error: --models 'x=nope': not A_MODEL=B_MODEL with 'nope' a model of sweep B (sweep A's: x, z;"),
        (["x"], "error: --models 'x': not A_MODEL=B_MODEL with 'x' a model of sweep A"),
        (["x=z"], "error: --models: two of sweep A's models would be compared with 'z'; pair 'z' too"),
        (["x=y", "z=y"], "error: --models 'z=y': each model is paired with one other at most"),
    ],
)
def test_a_wrong_models_pair_is_one_line_before_anything_is_aggregated(tmp_path, given, expected):
    one_model_sweeps(tmp_path, ("x", "z"), ("y", "z"))
    argv = ["report", A, "--compare", B, "--store", str(tmp_path), "--no-progress"]
    result = CliRunner().invoke(main, [*argv, *(f"--models={g}" for g in given)])
    assert result.exit_code == 2 and result.stderr.startswith(expected) and result.stderr.count("\n") == 1
    assert not list(tmp_path.rglob("report/*"))  # nothing aggregated, nothing written


def test_a_sweep_compared_with_itself_is_refused_in_one_line(tmp_path):
    """`report A --compare A` (or a prefix of A) printed a table of zero differences with p = 1 without a word."""
    sweeps(tmp_path)
    result = CliRunner().invoke(main, ["report", A, "--compare", A[:8], "--store", str(tmp_path), "--no-progress"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: --compare {A[:8]}: that is sweep {A} itself")
    assert not list(tmp_path.rglob("report/*"))  # nothing aggregated, nothing written


def test_models_without_compare_is_refused(tmp_path):
    one_model_sweeps(tmp_path)
    result = CliRunner().invoke(main, ["report", A, "--store", str(tmp_path), "--models", "x=y"])
    assert result.exit_code == 2 and "give it with --compare SWEEP_B" in result.stderr


def test_a_sweep_run_again_on_another_engine_pairs_the_engines(tmp_path):
    """Sweep A on decodebench's engine, B the same on vLLM (`engines: [{name: vllm}]`): before, no cell matched (their
    engines differ) and nothing was compared."""
    store = FileStore(tmp_path)
    write_sweep(store, make_sweep(n_prompts=16, sweep_id=A))
    write_sweep(store, make_sweep(n_prompts=16, sweep_id=B, engines=("vllm",)))
    cmp = compare_sweeps(A, B, store=store, n_boot=200)
    assert list(cmp["present"]) == ["both"] * 3  # the reference row ran on no engine: it matches as it is
    cells = cmp[cmp["strategy"] != "reference"]
    assert list(cells["engine"]) == ["decodebench → vllm"] * 2 and (cells["paired_prompts"] == 16).all()
    assert list(cells["cell_b"]) == ["austen-tiny::greedy::vllm", "austen-tiny::top_p(p=0.9,temperature=1.0)::vllm"]
    assert "| austen-tiny | greedy @ decodebench → vllm | both |" in compare_table(cmp)
