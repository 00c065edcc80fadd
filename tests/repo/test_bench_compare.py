"""`make bench-compare`'s airspeed velocity suite (benchmarks/asv_bench/speed.py) against this tree.

asv runs the suite on other commits; what can break here is the suite itself: its config, its
discovery, and its calls into this tree's benchmark harness (a renamed section or argument would
only show as a skipped benchmark on the next comparison). Speed is not asserted (benchmarks/README.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repo import REPO


def test_the_asv_config_and_suite_pass_asvs_own_check():
    run = subprocess.run(
        [str(Path(sys.executable).parent / "asv"), "check", "--python=same"],
        cwd=REPO / "benchmarks",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "No problems found" in run.stdout, run.stdout + run.stderr


@pytest.fixture
def smoke(monkeypatch):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from asv_bench import speed

    sys.path.remove(str(REPO / "benchmarks"))
    for name, value in {"PROMPTS": 4, "NEW": 4, "BATCH": 2, "BEAM_BATCH": 2, "ROUNDS": 1}.items():
        monkeypatch.setattr(speed, name, value)
    return speed


def test_the_suite_runs_this_trees_harness_and_times_are_own_over_peer(smoke):
    assert smoke.tree() == REPO  # the installed checkout (asv: the measured commit's)
    times = smoke.Ratios().setup_cache()
    assert set(times) == {"vs_generate", "vs_generate_mixed", "vs_generate_ragged", "beam_vs_generate"}
    assert all(t > 0 for t in times.values()) and smoke.Ratios().track_vs_generate(times) == times["vs_generate"]
    engine = smoke.Engine()
    for prompts in ("uniform", "ragged"):
        engine.setup("austen-tiny", prompts)
        assert engine.spec.compute == [] and len(engine.spec.prompts) == 4  # generation only, the smoke size
        engine.time_job("austen-tiny", prompts)
