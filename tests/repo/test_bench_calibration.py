"""The calibration benchmarks run (their figures live in docs/reports.md): bench_coverage, split and
joined with --start/--save/--load, bench_paired's simulated pairs under common random numbers, and
bench_constructions on both generative processes."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

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


def test_paired_pairs_take_the_seeds_asked_and_any_registered_metric():
    sys.path.insert(0, str(REPO))
    from benchmarks import bench_paired

    try:
        bench_paired.PAIR_SEEDS[0] = 1
        a, b, groups = bench_paired.pair_of_cells(6, 0, 0.0)
        ra, _, _ = bench_paired.pair_with_references(6, 0, 0.0)
        assert len(a.words) == len(b.words) == len(ra.texts) == 6 and groups == [[g] for g in range(6)]
    finally:
        bench_paired.PAIR_SEEDS[0] = bench_paired.SEEDS
    run = bench("benchmarks/bench_paired.py", "--sims", "3", "--prompts", "8", "--effect", "0", "--seeds", "1",
                "--n-boot", "50", "--metrics", "distinct_3", "rep_2")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "distinct_3   G=   8" in run.stdout and "rep_2        G=   8" in run.stdout
    bad = bench("benchmarks/bench_paired.py", "--sims", "1", "--metrics", "distinct_9x")
    assert bad.returncode == 2 and "--metrics: no metric named distinct_9x" in bad.stderr


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


def mean_interval(values: np.ndarray, center: float) -> tuple[float, float]:
    """bench_constructions' adjusted empirical likelihood interval of a mean, moved to `center` (its `ael` of the
    jackknife metrics' pseudo-values)."""
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_constructions import ratio_interval

    low, high = ratio_interval(values, np.ones(len(values)), adjusted=True)
    return low + center - values.mean(), high + center - values.mean()


@pytest.mark.parametrize("G", [8, 16, 40])
def test_the_adjusted_empirical_likelihood_interval_of_a_mean_is_the_dual_written_out(G):
    from tests.support.intervals import empirical_likelihood_mean

    values = np.random.default_rng(G).lognormal(0.0, 1.0, G)
    center = float(values.mean()) + 0.25
    low, high = mean_interval(values, center)
    assert (low, high) == pytest.approx(empirical_likelihood_mean(values, center), rel=1e-7)
    assert high - center > center - low  # a long right tail: the upper end reaches further


def test_the_empirical_likelihood_ends_are_where_its_statistic_meets_the_f_quantile():
    sys.path.insert(0, str(REPO))
    from scipy import stats as sps

    from benchmarks.bench_constructions import el_statistic, ratio_interval

    rng = np.random.default_rng(3)
    a, b = rng.lognormal(0, 1, 20), rng.integers(1, 9, 20).astype(float)
    crit, estimate = sps.f.ppf(0.95, 1, 19), a.sum() / b.sum()
    low, high = ratio_interval(a, b, adjusted=False)
    assert low < estimate < high
    assert el_statistic(a - low * b) == pytest.approx(crit) and el_statistic(a - high * b) == pytest.approx(crit)
    assert el_statistic(a - estimate * b) == pytest.approx(0, abs=1e-12)
    adjusted = ratio_interval(a, b)
    assert adjusted[0] < low and high < adjusted[1]  # the pseudo-observation widens it
    assert el_statistic(np.array([1.0, 2.0])) == math.inf  # a mean of 0 is outside their hull
    assert ratio_interval(np.full(8, 0.4), np.ones(8)) == (0.4, 0.4)
    assert ratio_interval(np.array([1.0, 3.0]), np.ones(2)) == (-math.inf, math.inf)  # never reaches F(1, 1)


def test_pseudo_values_alike_but_for_rounding_noise_give_an_interval_not_an_error():
    """The multiplier's root was sought on z's own scale: with z of 1e-9 its range ran to 1e9 and brentq gave up
    (RuntimeError). R does not change with z's scale; it is sought at scale 1."""
    x = np.array([0.09999999897386826, 0.0999999990128318, 0.09999999964448356, 0.10000000006030249,
                  0.0999999994989389, 0.09999999943584734, 0.10000000092803787, 0.10000000050455034,
                  0.09999999910021182, 0.10000000066511634, 0.10000000058415712, 0.0999999997349232,
                  0.10000000069156649, 0.10000000083193307, 0.10000000023418519, 0.10000000019743564])  # fmt: skip
    low, high = mean_interval(x, 0.1)
    assert low < 0.1 < high and high - low < 1e-8


def test_coverage_takes_any_registered_metric_and_names_an_unknown_one():
    """Zipf's interval was measured this way (docs/reports.md, "Zipf's interval, measured")."""
    ran = bench("benchmarks/bench_coverage.py", "--prompts", "8", "--sims", "2", "--metrics", "zipf", "--seeds", "1",
                "--population", "200", "--n-boot", "20", "--process", "markov")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "zipf" in ran.stdout and "(n=2," in ran.stdout
    unknown = bench("benchmarks/bench_coverage.py", "--sims", "1", "--metrics", "zipff")
    assert unknown.returncode != 0 and "unknown metric 'zipff'" in unknown.stderr


def test_the_accuracy_benchmark_runs_and_its_wrong_answers_keep_the_gold_first_in_a_tie():
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_accuracy import draw
    from controller.metrics.answers import majority

    cell, groups = draw(10_000, 1, (0.5, 0.5), np.random.default_rng(0))  # as many prompts as a population's
    assert len(groups) == 10_000 and cell.task == {"extract": ["last_number"]}
    for g in groups:  # a 1-1 vote goes to the gold answer in every prompt ('9000' against '10000' did not)
        gold, wrong = cell.answers[g[0]][0], str(int(cell.answers[g[0]][0]) + 1000)
        assert majority([wrong, gold]) == gold
    run = bench("benchmarks/bench_accuracy.py", "--sims", "3", "--prompts", "8", "--samples", "3",
                "--population", "300")  # fmt: skip
    assert run.returncode == 0, run.stderr
    for name in ("exact_match", "pass@1", "pass@3", "maj@3", "betting", "kg-df"):
        assert f"  {name:12s} G=   8  covers" in run.stdout, name
    second = bench("benchmarks/bench_accuracy.py", "--sims", "3", "--prompts", "8", "--samples", "3",
                   "--population", "300", "--logit-normal", "3", "1.5")  # fmt: skip
    assert second.returncode == 0 and second.stdout.startswith("logit-normal(3.0, 1.5), 3 answers"), second.stderr
