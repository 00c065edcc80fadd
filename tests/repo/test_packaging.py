"""Packaging: the controller never imports torch; the console scripts and listings work."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.cli import main
from tests.support.repo import REPO

pytestmark = pytest.mark.pure


def test_controller_does_not_import_torch():
    code = (
        "import sys, importlib, pkgutil, controller\n"
        "for m in pkgutil.walk_packages(controller.__path__, 'controller.'):\n"
        "    importlib.import_module(m.name)\n"
        "import worker.strategies, worker.store, worker.sweepstate, worker.core.contract, worker.core.paths\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "print(heavy); sys.exit(1 if heavy else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_dependencies_exclude_torch_and_the_extra_adds_it():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    assert "torch" not in base and "transformers" not in base
    worker = " ".join(project["optional-dependencies"]["worker"]).lower()
    for name in ("torch", "transformers", "safetensors", "nvidia-ml-py"):
        assert name in worker
    assert set(project["scripts"]) == {"decodebench", "decodebench-worker"}


def test_report_assets_are_package_data():
    """report.html inlines the files of controller/report/render/assets/, a rating sheet's page those of
    controller/report/ratings/assets/: an installed package must ship them."""
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = set()
    for room in ("render", "ratings"):
        folder = REPO / "controller" / "report" / room
        assets = sorted(p.relative_to(folder).as_posix() for p in (folder / "assets").iterdir())
        patterns = package_data.get(f"controller.report.{room}", []) + package_data.get("*", [])
        for asset in assets:
            assert any(fnmatch(asset, pattern) for pattern in patterns), (room, asset)
        shipped |= {f"{room}/{a}" for a in assets}
    assert {"render/assets/report.css", "render/assets/report.js", "render/assets/error_trap.js"} <= shipped
    assert "ratings/assets/rating.js" in shipped


def test_strategies_and_metrics_listings():
    out = CliRunner().invoke(main, ["strategies"])
    assert out.exit_code == 0
    for name in (
        "greedy",
        "beam",
        "top_k",
        "top_p",
        "typical",
        "min_p",
        "epsilon",
        "eta",
        "repetition_penalty",
        "no_repeat_ngram_size",
    ):
        assert name in out.output
    assert "p: float (>0.0, <=1.0), default 0.9" in out.output
    out = CliRunner().invoke(main, ["metrics"])
    assert out.exit_code == 0
    for name in ("rep_4", "diversity", "distinct_3", "self_bleu_4", "zipf", "perplexity", "bleu", "rouge_l"):
        assert f"\n{name}  (corpus" in "\n" + out.output, name
    assert "needs references" in out.output and "needs model" in out.output
    assert "\nrep_2  (corpus, lower is better; in [0, 1]; bootstrap interval" in out.output
    assert "\nzipf  (corpus, no direction; jackknife interval" in out.output


def test_cli_help_as_a_subprocess():
    exe = Path(sys.executable).with_name("decodebench")
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "validate" in proc.stdout and "run" in proc.stdout


def test_the_readme_puts_decodebench_on_the_path_before_its_first_command():
    """A new user follows the README (issue 28, item 3): `make demo` installs into .venv, and the README
    says how to put that `decodebench` on the PATH before it shows a bare `decodebench` command; the
    activation script it names puts the console script first on the PATH."""
    text = (REPO / "README.md").read_text()
    code = [line for block in text.split("```")[1::2] for line in block.splitlines()]  # the fenced blocks' lines
    activate = next(i for i, line in enumerate(code) if line.startswith("source .venv/bin/activate"))
    first = next(i for i, line in enumerate(code) if line.startswith("decodebench "))
    assert activate < first
    assert "VENV   ?= .venv" in (REPO / "Makefile").read_text()
    venv = REPO / ".venv"
    if venv.is_dir():  # where make install made it: the script it names exists and puts decodebench first
        shell = f"source {venv}/bin/activate && command -v decodebench"
        proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0 and proc.stdout.strip() == f"{venv}/bin/decodebench", proc.stderr
