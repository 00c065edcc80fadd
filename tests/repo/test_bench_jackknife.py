"""The jackknife benchmark runs: every built-in jackknife metric's exact leave-one-out values equal recomputing the
metric without each prompt (the script asserts it), several seeds a prompt (its figures: benchmarks/README.md)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.repo import REPO


def test_the_jackknife_benchmark_compares_every_exact_leave_one_out_with_recomputing():
    args = ["--prompts", "12", "--seeds", "2", "--tokens", "20", "--recount", "12"]
    run = subprocess.run([sys.executable, "benchmarks/bench_jackknife.py", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    for name in ("distinct_2", "self_bleu_4", "zipf"):
        assert f"12 prompts  {name:12s} one value" in run.stdout and "(projected from 12)" in run.stdout
