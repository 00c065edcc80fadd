"""Strategy plugins (entry-point group `decodebench.strategies`): the example plugin, Mirostat
(examples/plugin-strategy, installed by `make install`), against an implementation written here from
the paper; a tiny sweep with it; and plugins that fail, each one line, never a crash."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from controller.cli import main
from worker.core.registry import Registry
from worker.strategies import STRATEGIES, Kind, Param, Strategy
from worker.strategies.plugins import GROUP, load_plugins

DECODEBENCH = str(Path(sys.executable).with_name("decodebench"))


# --- Mirostat against an independent implementation (Basu et al. 2021, Algorithm 1) ---------------


def reference_mirostat(logits: list[float], mu: float, tau: float, eta: float, m: int, u: float):
    """One step of Mirostat for one row in plain floats, as the paper and the authors' code write it:
    (token, new mu). The draw: inverse CDF at `u` over the kept tokens in token-id order, the engine's
    seeded draw (its uniforms are the engine's contract, not Mirostat's)."""
    top = max(logits)
    z = sum(math.exp(x - top) for x in logits)
    prob = [math.exp(x - top) / z for x in logits]
    order = sorted(range(len(prob)), key=lambda i: -prob[i])
    p = [prob[i] for i in order]
    num = den = 0.0
    for i in range(min(m, len(p) - 1)):
        t = math.log((i + 2) / (i + 1))
        num += math.log(p[i] / p[i + 1]) * t
        den += t * t
    s = num / den
    eps = s - 1
    n = len(p)
    k = round(((eps * 2**mu) / (1 - n ** (-eps))) ** (1 / s)) + 1
    k = max(1, min(n, k))
    kept = sorted(order[:k])
    mass = [prob[i] for i in kept]
    target, acc = u * sum(mass), 0.0
    token = kept[-1]
    for i, q in zip(kept, mass):
        acc += q
        if acc > target:
            token = i
            break
    surprise = -math.log2(prob[token])
    return token, mu - eta * (surprise - tau)


class FakeRows:
    def __init__(self, live: list[int], steps: int) -> None:
        import torch

        self.live = torch.tensor(live)
        self.steps = torch.full((len(live),), steps, dtype=torch.long)


def mirostat_step(total: int, max_new: int, seeds: list[int], **params):
    import torch
    from decodebench_mirostat.step import MirostatStep

    from worker.engine.choose import Rules
    from worker.engine.rows import Ends
    from worker.engine.sampling import SeededSampler

    sampler = SeededSampler(seeds, "cpu", max_steps=max_new)
    rules = Rules(processors=None, warpers=None, stop=None, ends=Ends([], 0, max_new))
    tokens = torch.zeros(total, max_new + 1, dtype=torch.long)
    return MirostatStep(rules, sampler, tokens, **params)


def test_mirostat_matches_the_paper_row_by_row_as_rows_leave():
    import torch

    from worker.engine.sampling import counter_uniforms

    torch.manual_seed(0)
    total, vocab, steps, seeds = 3, 300, 24, [11, 22, 33]
    tau, eta, m = 3.0, 0.1, 100
    step = mirostat_step(total, steps, seeds, tau=tau, eta=eta, m=m)
    uniforms = counter_uniforms(torch.tensor(seeds), torch.arange(steps))
    zipf = -1.1 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))  # Zipf-like, then shuffled
    mu = [2 * tau] * total
    for t in range(steps):
        live = [0, 1, 2] if t < 8 else [0, 2]  # row 1 finished: compaction drops it
        logits = torch.stack([zipf[torch.randperm(vocab)] + 0.5 * torch.randn(vocab) for _ in live])
        step.sampler.rows = torch.tensor(live)
        got = step.choose(logits.clone(), FakeRows(live, t))
        for j, row in enumerate(live):
            want, mu[row] = reference_mirostat(logits[j].tolist(), mu[row], tau, eta, m, float(uniforms[row, t]))
            assert int(got[j]) == want, (t, row)
            assert float(step.mu[row]) == pytest.approx(mu[row], abs=1e-9)


def test_mirostat_controls_surprise():
    """What the method is for: the observed surprise tracks tau (the paper's Figure 3), whatever mu starts at."""
    import torch

    from worker.engine.sampling import SeededSampler

    torch.manual_seed(1)
    vocab, steps, tau = 2000, 400, 4.0
    step = mirostat_step(1, steps, [5], tau=tau, eta=0.1, m=100)
    step.sampler = SeededSampler([5], "cpu", max_steps=steps)
    zipf = -1.05 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    surprises = []
    for t in range(steps):
        logits = zipf[torch.randperm(vocab)][None]
        token = int(step.choose(logits.clone(), FakeRows([0], t))[0])
        surprises.append(-float(torch.log_softmax(logits.double(), -1)[0, token]) / math.log(2))
    assert sum(surprises[100:]) / len(surprises[100:]) == pytest.approx(tau, abs=0.35)


# --- a tiny sweep with the plugin, in the engine's own loop ----------------------------------------

SPEC = """
name: plugin-sweep
models:
  - path: {model}
    name: tiny
prompts:
  path: {prompts}
  limit: 4
strategies:
  - name: mirostat
    params: {{tau: 3.0}}
  - name: greedy
generation:
  max_new_tokens: 10
  batch_size: 2
  seeds: [0]
"""


@pytest.mark.slow
def test_a_sweep_runs_the_plugin_with_every_metric_and_timing(tmp_path, tiny_model, prompts_file):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC.format(model=tiny_model, prompts=prompts_file))
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["--log-level", "warning", "run", str(spec), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    (sweep,) = (out / "default" / "sweeps").iterdir()
    results = [json.loads(p.read_text()) for p in sweep.glob("jobs/*/result.json")]
    (miro,) = [r for r in results if r["job"]["strategy"]["name"] == "mirostat"]
    plan = miro["engine"]["plan"]
    assert plan["path"] == "decode" and plan["kind"] == "custom"
    assert plan["step"] == "decodebench_mirostat.step.MirostatStep"
    assert any("decodebench-mirostat" in note for note in miro["notes"])
    summary = pd.read_csv(sweep / "report" / "summary.csv")
    row = summary[summary["strategy"] == "mirostat"].iloc[0]
    for column in ("tokens_per_s", "latency_ms_p50", "ttft_ms_p50", "peak_memory_mb", "mean_length", "distinct_2"):
        assert not pd.isna(row[column]) and row[column] > 0, column


# --- plugins that fail: one line each, the built-ins unaffected ------------------------------------

GOOD = Strategy("fine", "a fine plugin", {"x": Param(float, 0.5, "x", min=0, max=1)}, True, lambda p: {})
NOT_A_STRATEGY = {"name": "dict"}
MISNAMED = GOOD
NO_STEP = Strategy("nostep", "custom without a step", {}, False, lambda p: {}, kind=Kind.CUSTOM)
STEP_ON_TOKEN = Strategy("tokenstep", "a token kind with a step", {}, False, lambda p: {}, step="a.b:C")
MODIFIER_CLASH = Strategy(
    "clash", "a parameter named like a modifier", {"repetition_penalty": Param(float, 1.0, "r")}, False, lambda p: {}
)
MISSING_STEP = Strategy("gone", "its step module is missing", {}, False, lambda p: {}, kind=Kind.CUSTOM, step="nope:X")


def entry(name: str, attr: str) -> EntryPoint:
    return EntryPoint(name=name, value=f"tests.unit.worker.strategies.test_plugins:{attr}", group=GROUP)


@pytest.mark.pure
def test_each_bad_plugin_is_refused_with_its_reason_and_a_good_one_registers():
    registry: Registry[Strategy] = Registry("strategy")
    for name, strategy in STRATEGIES.items():
        registry.register(name, strategy)
    broken: dict[str, str] = {}
    problems = load_plugins(
        [
            entry("fine", "GOOD"),
            entry("dict", "NOT_A_STRATEGY"),
            entry("other", "MISNAMED"),
            entry("nostep", "NO_STEP"),
            entry("tokenstep", "STEP_ON_TOKEN"),
            entry("clash", "MODIFIER_CLASH"),
            entry("gone", "MISSING_STEP"),
            entry("greedy", "GOOD"),
            entry("absent", "NO_SUCH_NAME"),
        ],
        registry,
        broken,
        sink=None,  # the process's PROBLEMS stay the installed plugins' (the CLI prints them)
    )
    reasons = {p.name: p.reason for p in problems}
    assert "fine" in registry
    assert registry.get("fine").plugin.startswith("fine = tests.unit.worker.strategies.test_plugins:GOOD")
    assert "not a worker.strategies.Strategy" in reasons["dict"]
    assert "give both one name" in reasons["other"]
    assert "kind custom needs step" in reasons["nostep"]
    assert "step is for kind custom only" in reasons["tokenstep"]
    assert "clashes with the modifier" in reasons["clash"]
    assert "'nope' is not installed" in reasons["gone"]
    assert "clashes with the built-in strategy 'greedy'" in reasons["greedy"]
    assert reasons["absent"].startswith("AttributeError")
    assert len(problems) == 8 and registry.get("greedy") is STRATEGIES.get("greedy")
    assert all(p.line.startswith(f"plugin {p.name} = tests.unit.worker.strategies.test_plugins:") for p in problems)
    assert "not loaded" in broken["gone"]


def fake_distribution(root: Path) -> None:
    """An installed distribution with four broken plugins, found on PYTHONPATH by importlib.metadata."""
    info = root / "broken_plugins-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{GROUP}]\n"
        "crashes = broken_plugins.crashes:STRATEGY\n"
        "top_k = broken_plugins.clash:STRATEGY\n"
        "badparam = broken_plugins.badparam:STRATEGY\n"
        "badkind = broken_plugins.badkind:STRATEGY\n"
    )
    pkg = root / "broken_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "crashes.py").write_text("import not_a_module_anywhere\n")
    head = "from worker.strategies import Kind, Param, Strategy\n"
    (pkg / "clash.py").write_text(head + "STRATEGY = Strategy('top_k', 'mine', {}, True, lambda p: {})\n")
    (pkg / "badparam.py").write_text(
        head + "STRATEGY = Strategy('badparam', 'd', {'q': Param(float, 5.0, 'q', max=1.0)}, True, lambda p: {})\n"
    )
    (pkg / "badkind.py").write_text(head + "STRATEGY = Strategy('badkind', 'd', {}, True, lambda p: {}, kind='warp')\n")


@pytest.mark.slow
def test_broken_plugins_are_one_line_each_in_strategies_and_validate(tmp_path, tiny_model, prompts_file):
    fake_distribution(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    run = lambda *args: subprocess.run([DECODEBENCH, *args], capture_output=True, text=True, env=env, timeout=120)
    listed = run("strategies")
    assert listed.returncode == 0, listed.stderr
    assert "greedy" in listed.stdout and "mirostat" in listed.stdout and "Traceback" not in listed.stderr
    lines = listed.stderr.strip().splitlines()
    assert len(lines) == 4, listed.stderr
    want = {
        "crashes": "ModuleNotFoundError: No module named 'not_a_module_anywhere'",
        "top_k": "name clashes with the built-in strategy 'top_k'",
        "badparam": "its default fails its own check: q must be <= 1.0",
        "badkind": "unknown kind 'warp'",
    }
    for line, (name, reason) in zip(sorted(lines), sorted(want.items())):
        assert line.startswith(f"plugin {name} = broken_plugins.") and "(broken-plugins 0.1)" in line, line
        assert reason in line, line
    spec = tmp_path / "sweep.yaml"
    spec.write_text(textwrap.dedent(SPEC.format(model=tiny_model, prompts=prompts_file)))
    ok = run("validate", str(spec))
    assert ok.returncode == 0 and ": valid" in ok.stdout and len(ok.stderr.strip().splitlines()) == 4
    spec.write_text(spec.read_text().replace("name: greedy", "name: crashes"))
    bad = run("validate", str(spec))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "plugin crashes = broken_plugins.crashes:STRATEGY (broken-plugins 0.1): not loaded" in bad.stderr


SAMPLES_BUT_DETERMINISTIC = Strategy(
    "notseeded", "samples, declared deterministic", {}, False, lambda p: {"do_sample": True, "num_beams": 1}
)


@pytest.mark.pure
def test_a_plugin_that_samples_but_is_declared_deterministic_is_refused():
    """A plugin whose to_config samples but that says `stochastic=False` was registered: the planner ran it with the
    first seed only and refused `samples`, so a sampling method was reported as deterministic, its variation over
    seeds never measured. Now it is refused with its line, as the other bad declarations are."""
    registry: Registry[Strategy] = Registry("strategy")
    problems = load_plugins([entry("notseeded", "SAMPLES_BUT_DETERMINISTIC")], registry, {}, sink=None)
    (problem,) = problems
    assert "to_config samples (do_sample: true) but stochastic is false" in problem.reason
    assert "notseeded" not in registry
