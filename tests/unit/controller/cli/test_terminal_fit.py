"""Every terminal view fits its window (issue 42, item 3), checked in a real terminal: tmux at 80x24 and
100x30, the screen read back with wrapped lines joined (`capture-pane -J`), so a line longer than the
window is one that wrapped. `status --watch` (a 40-cell sweep with long names): short cell labels, no row
wrapped, the totals and the throughput/ETA line on screen; the fitted summary table: the sweep's quality
metrics before memory and latency; `strategies` and `metrics`: wrapped, continuation lines indented.
tmux comes from the system (Debian package `tmux`)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.repo import REPO

SIZES = [(80, 24), (100, 30)]

WATCH = """
from controller.cli.distributed import watch_live
label = "{}::top_k(k={},temperature=0.7,repetition_penalty=1.3)"
models = ("austen-small-finetuned-on-persuasion", "austen-tiny-finetuned-on-emma")
cells = {label.format(m, k): {"done": 2, "queued": 1} for m in models for k in range(20)}
class Fake:
    n = 0
    def status(self, sweep):
        self.n += 1
        done = self.n >= 3
        totals = {"queued": 0 if done else 40, "running": 0, "done": 80, "failed": 0, "cancelled": 0}
        return {"sweep_id": "s1", "name": "demo", "tenant": "default", "queue": "q", "cancelled": False, "jobs": 120,
                "complete": done, "cells": cells, "totals": totals, "jobs_per_s": 0.5, "tokens_per_s": 1234.0,
                "eta_s": 80, "lost": 0, "stale": 0, "n_failures": 0, "failures": [], "problems": []}
watch_live(Fake(), "s1", 0.2)
"""

TABLE = """
from controller.cli.table import print_summary
from controller.report.compute.aggregate import summarize
from tests.support.report import make_sweep
cells = [(m, s, p) for m in ("austen-tiny", "austen-small") for s, p in (("greedy", {}), ("top_p", {"p": 0.9}))]
print_summary(summarize(make_sweep(n_prompts=6, seeds=(0, 1), cells=cells), n_boot=20, n_boot_corpus=5))
"""


def tmux() -> str:
    found = shutil.which("tmux")
    if not found:
        pytest.fail("no tmux: apt-get install tmux (scripts/setup-test-deps.sh installs it)")
    return found


def screen(tmp_path: Path, argv: list[str], cols: int, rows: int) -> list[str]:
    """What a terminal of cols x rows shows once argv has exited: every line of its history, wrapped ones joined."""
    sock, done = f"fit-{os.getpid()}-{cols}", tmp_path / f"done-{cols}"
    script = tmp_path / f"run-{cols}.sh"
    command = ["env", "-u", "COLUMNS", "-u", "LINES", f"PYTHONPATH={REPO}", "TERM=xterm-256color", *argv]
    script.write_text(
        f"cd {shlex.quote(str(REPO))}\n{shlex.join(command)}\necho $? > {shlex.quote(str(done))}\nsleep 60\n"
    )
    base = [tmux(), "-L", sock, "-f", "/dev/null"]
    subprocess.run([*base, "new-session", "-d", "-x", str(cols), "-y", str(rows), "bash", str(script)], check=True)
    try:
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert done.exists(), "the command did not finish"
        assert done.read_text().strip() == "0"
        out = subprocess.run([*base, "capture-pane", "-p", "-J", "-S", "-", "-t", "0"], capture_output=True, text=True)
        return [line.rstrip() for line in out.stdout.rstrip("\n").splitlines()]
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True)


@pytest.mark.parametrize("cols, rows", SIZES)
def test_status_watch_fits_with_its_totals_and_eta_in_view(tmp_path, cols, rows):
    lines = screen(tmp_path, [sys.executable, "-c", WATCH], cols, rows)
    last = lines[-rows:]  # the final redraw, as left on screen
    assert all(len(line) <= cols for line in last), [line for line in last if len(line) > cols]
    assert any(line.startswith("80/120 jobs done") for line in last), last
    assert any(line.startswith("throughput: 30.0 jobs/min, 1,234 tokens/s; complete") for line in last), last
    rows_shown = [line.split("  ")[1] for line in last if "top_k(k=" in line]
    assert len(rows_shown) >= 5 and len(set(rows_shown)) == len(rows_shown)  # short labels, still distinct
    assert all("temperature" not in row for row in rows_shown)  # a parameter every cell shares is left out
    assert any("more cells" in line for line in last)  # the rest counted, not pushed off the screen


@pytest.mark.parametrize("cols, rows", SIZES)
def test_the_fitted_table_shows_quality_before_memory_and_latency(tmp_path, cols, rows):
    lines = screen(tmp_path, [sys.executable, "-c", TABLE], cols, rows)
    header = next(line for line in lines if line.lstrip().startswith("model"))
    assert all(len(line) <= cols for line in lines), lines
    assert "tok/s" in header and ("diversity" in header or "perplexity" in header), header
    if "mem MB" in header or "p50 ms" in header:  # kept only where every quality column fits first
        assert "bleu" in header and "perplexity" in header, header


@pytest.mark.parametrize("command", ["strategies", "metrics"])
@pytest.mark.parametrize("cols, rows", SIZES)
def test_strategies_and_metrics_wrap_and_indent(tmp_path, command, cols, rows):
    exe = str(Path(sys.executable).with_name("decodebench"))
    lines = [line for line in screen(tmp_path, [exe, command], cols, rows) if line]
    assert len(lines) > 10
    assert all(len(line) <= cols for line in lines), [line for line in lines if len(line) > cols]
    entries = [line for line in lines if not line.startswith(" ")]
    assert any(line.startswith("    ") for line in lines) and len(entries) < len(lines)  # continuation indented
