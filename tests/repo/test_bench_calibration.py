"""The calibration benchmarks run (their figures live in docs/reports.md): bench_coverage, split and
joined with --start/--save/--load, bench_paired's simulated pairs under common random numbers, and
bench_constructions on both generative processes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from tests.support.repo import REPO


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_coverage_parts_are_joined_and_overlapping_parts_refused(tmp_path):
    common = ["benchmarks/bench_coverage.py", "--prompts", "8", "--sims", "3", "--metrics", "distinct_2", "rep_2",
              "--population", "200", "--n-boot", "50"]  # fmt: skip
    assert bench(*common, "--save", str(tmp_path / "a.json")).returncode == 0
    assert bench(*common, "--start", "3", "--save", str(tmp_path / "b.json")).returncode == 0
    joined = bench("benchmarks/bench_coverage.py", "--load", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert joined.returncode == 0, joined.stderr
    assert "G=8: 6 simulations" in joined.stdout and "(n=6," in joined.stdout
    twice = bench("benchmarks/bench_coverage.py", "--load", str(tmp_path / "a.json"), str(tmp_path / "a.json"))
    assert twice.returncode != 0 and "overlap" in twice.stderr


def test_paired_cells_share_their_random_numbers_and_the_benchmark_runs():
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_paired import pair_of_cells, pair_with_references

    a, b, groups = pair_of_cells(6, 0, 0.0)
    assert len(groups) == 6 and len(a.words) == len(b.words) == 18
    # common random numbers: the same prompt's texts agree far more often than two prompts' do
    same = np.mean([x == y for wa, wb in zip(a.words, b.words) for x, y in zip(wa, wb)])
    other = np.mean([x == y for wa, wb in zip(a.words, b.words[3:] + b.words[:3]) for x, y in zip(wa, wb)])
    assert same > 0.3 > other
    a2, _, _ = pair_of_cells(6, 0, 0.5)  # an effect changes B only
    assert a2.words == a.words
    ra, rb, _ = pair_with_references(6, 0, 0.0)  # BLEU's pairs: the same references, correlated copies
    assert ra.references == rb.references and len(ra.texts) == 18
    copied = lambda cell: np.mean([w in r.split() for t, r in zip(cell.texts, cell.references) for w in t.split()])
    ra2, rb2, _ = pair_with_references(6, 0, 0.5)
    assert ra2.texts == ra.texts and copied(rb2) > copied(rb)
    run = bench("benchmarks/bench_paired.py", "--sims", "3", "--prompts", "8", "--effect", "0", "0.1",
                "--population", "200", "--n-boot", "50")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "size (rejected at 0.05)" in run.stdout and "power (rejected at 0.05)" in run.stdout


def test_the_constructions_benchmark_runs_every_construction_on_both_processes():
    for process in ("skewed", "markov"):
        run = bench("benchmarks/bench_constructions.py", "--process", process, "--prompts", "8", "--sims", "4",
                    "--population", "200", "--metrics", "rep_2", "distinct_2", "--efron-stein")  # fmt: skip
        assert run.returncode == 0, run.stderr
        for name in ("oracle", "before", "smoothed", "student", "symmetric", "bca", "expanded-bca", "stabilised",
                     "el ", "ael"):  # fmt: skip
            assert f"rep_2        {name}" in run.stdout and f"distinct_2   {name}" in run.stdout
        for name in ("efron-stein ", "efron-stein-skew", "variance (logit): jackknife"):  # the jackknife metrics'
            assert f"distinct_2   {name}" in run.stdout and f"rep_2        {name}" not in run.stdout
