"""`decodebench validate` on hostile inputs under 10 MB: wall time and peak memory of each.

The goal (issue 14): every input under 10 MB is answered (valid, or one error line) in
under 2 s and 500 MB. Each case runs `decodebench validate` as its own process; the
peak RSS is that process's (wait4). Run: python benchmarks/bench_validate.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "models" / "austen-tiny"
SMALL = REPO / "examples" / "models" / "austen-small"
HEAD = f"name: bench\nmodels:\n  - path: {TINY}\n  - path: {SMALL}\n"
STRATEGIES = (
    "strategies:\n  - name: greedy\n  - name: top_p\n    params: {p: [0.8, 0.9]}\ngeneration:\n  seeds: [0, 1, 2]\n"
)


def inline(n: int) -> str:
    return "prompts:\n  inline: [" + ", ".join(["a"] * n) + "]\n"


def prompts_file(d: Path, n_bytes: int) -> Path:
    line = json.dumps({"prompt": "It is a truth universally acknowledged, that a single man", "reference": "x" * 40})
    p = d / "prompts.jsonl"
    p.write_text((line + "\n") * (n_bytes // (len(line) + 1)))
    return p


def cases(d: Path) -> dict[str, Path]:
    out: dict[str, str | bytes] = {}
    pf = prompts_file(d, 10_000_000 - 1)
    out["10 MB prompt file, shard 64 (valid)"] = HEAD + f"prompts:\n  path: {pf}\n  shard_size: 64\n" + STRATEGIES
    out["10 MB prompt file, shard 1 (over the job limit)"] = (
        HEAD + f"prompts:\n  path: {pf}\n  shard_size: 1\n" + STRATEGIES
    )
    grid = "strategies:\n  - name: top_p\n    params: {p: [" + ",".join(["1"] * 120_000) + "]}\n"
    out["grid of 120k values, 240 kB (over the job limit)"] = HEAD + inline(1) + grid
    out["grid of 5M values, 9.9 MB (over the size limit)"] = (
        HEAD + inline(1) + "strategies:\n  - name: top_p\n    params: {p: [" + ",".join(["1"] * 4_950_000) + "]}\n"
    )
    levels = ["a0: &a0 [" + ",".join(["0.5"] * 10) + "]"]
    levels += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    out["alias bomb, 10^9 values (refused)"] = HEAD + inline(1) + "x:\n  " + "\n  ".join(levels) + "\n" + STRATEGIES
    out["nesting 100k deep (refused)"] = "name: " + "[" * 100_000 + "]" * 100_000 + "\n"
    out["60k inline prompts, 180 kB (valid)"] = (
        HEAD + inline(60_000).replace("inline:", "shard_size: 512\n  inline:") + STRATEGIES
    )
    out["9.9 MB of binary (refused)"] = os.urandom(9_900_000)
    paths = {"quickstart (valid)": REPO / "examples" / "quickstart.yaml"}
    for i, (name, body) in enumerate(out.items()):
        p = d / f"case{i}.yaml"
        p.write_bytes(body if isinstance(body, bytes) else body.encode())
        paths[name] = p
    return paths


def measure(path: Path) -> tuple[float, float, int, str]:
    cmd = [sys.executable, "-c", "from controller.cli import main; main()", "validate", str(path)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), (err[-1] if err else "")[:90]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        baseline = measure(d / "missing.yaml")[0]  # interpreter and CLI start-up
        print(f"start-up (a missing file): {baseline:.2f} s")
        print(f"{'case':52} {'size':>10} {'time s':>7} {'RSS MB':>7} exit  answer")
        worst_t = worst_m = 0.0
        for name, path in cases(d).items():
            wall, rss, code, line = measure(path)
            worst_t, worst_m = max(worst_t, wall), max(worst_m, rss)
            print(f"{name:52} {path.stat().st_size:>10,} {wall:7.2f} {rss:7.0f} {code:>4}  {line}")
        print(f"worst: {worst_t:.2f} s, {worst_m:.0f} MB (goal: under 2 s and 500 MB)")


if __name__ == "__main__":
    main()
