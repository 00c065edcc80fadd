"""The suite itself (issue 40, item 5). The `pure` marker (`make test-fast`) means what it says: a module
holding pure tests imports without torch or transformers, so that `pytest -m pure` runs where only the
controller is installed (a module that needs torch is skipped there by tests/conftest.py, not a collection
error). CI's run (the README's `make test`) prints the 25 slowest tests."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.support.repo import REPO

pytestmark = pytest.mark.pure
# A fresh interpreter in which torch and transformers are not installed, as far as imports can tell.
BLOCK = """
import importlib, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in ("torch", "transformers"):
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
sys.meta_path.insert(0, NoTorch())
"""


def _is_pure(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "pure" for n in ast.walk(node))


def pure_modules() -> list[str]:
    """The test modules with a pure test: marked as a whole (`pytestmark`) or test by test."""
    found = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        marks = [n.value for n in tree.body if isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n.targets[0])]
        decorated = [d for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for d in n.decorator_list]
        if any(_is_pure(m) for m in marks + decorated):
            found.append(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


def test_every_module_with_pure_tests_imports_without_torch():
    modules = pure_modules()
    known = {"tests.unit.worker.core.test_mig", "tests.unit.worker.strategies.test_plugins", "tests.repo.test_layout"}
    assert known <= set(modules)
    code = BLOCK + (
        "failed = []\n"
        f"for name in {modules!r}:\n"
        "    try:\n        importlib.import_module(name)\n"
        "    except ImportError as err:\n        failed.append(f'{name}: {err}')\n"
        "print('\\n'.join(failed))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", f"pure test modules that need torch:\n{out.stdout}"


def test_ci_runs_the_readmes_test_command_and_prints_the_slowest_tests():
    readme = (REPO / "README.md").read_text()
    assert "\nmake test    #" in readme  # the README's test command
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test"
    makefile = (REPO / "Makefile").read_text()
    (recipe,) = [line for line in makefile.split("\ntest: install\n", 1)[1].splitlines()[:1]]
    assert "scripts/run-tests.sh" in recipe
    suite = [line for line in (REPO / "scripts" / "run-tests.sh").read_text().splitlines() if "-m pytest" in line]
    assert "--durations=25" in suite[0] and "tests/vllm/test_vllm_env.py" in suite[0]  # the main suite, first
