"""The suite itself (issue 40, item 5): a layout a contributor can place a test in (docs/architecture.md, "The
tests"), unit tests in the folder that mirrors their package, the cross-cutting ones in their own folders,
shared code in tests/support and no test module importing another. The `pure` marker (`make test-fast`)
means what it says: a module holding pure tests imports without torch or transformers, so that `pytest -m
pure` runs where only the controller is installed (a module that needs torch is skipped there by
tests/conftest.py, not a collection error). CI's run (the README's `make test`) prints the 25 slowest tests."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repo import REPO

pytestmark = pytest.mark.pure
TESTS = REPO / "tests"
# The suite's folders, each described in docs/architecture.md ("The tests"): where a new test goes.
FOLDERS = {"unit", "e2e", "chart", "hostile", "browser", "vllm", "gpu", "repo", "support"}
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


def modules_of_tests() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def test_the_suite_has_its_folders_and_no_test_outside_them():
    top = {p.name for p in TESTS.iterdir() if p.name != "__pycache__"} - {"__init__.py", "conftest.py"}
    assert top == FOLDERS, "a new folder of tests/ is named in FOLDERS and in docs/architecture.md"
    placed = [p.relative_to(TESTS) for p in modules_of_tests()]
    misplaced = [str(p) for p in placed if p.parts[0] in (p.name, "support")]
    assert misplaced == [], "a test module goes into one of the folders (docs/architecture.md, 'The tests')"
    documented = (REPO / "docs" / "architecture.md").read_text()
    assert [f for f in sorted(FOLDERS) if f"`tests/{f}/`" not in documented] == []


def test_every_unit_test_folder_mirrors_a_source_package():
    folders = {p.parent.relative_to(TESTS / "unit") for p in modules_of_tests() if p.is_relative_to(TESTS / "unit")}
    assert folders, "no unit tests found"
    strays = sorted(str(f) for f in folders if not (REPO / f / "__init__.py").is_file())
    assert strays == [], "tests/unit/<path>/ holds the tests of the package <path>/, which must exist"


def test_every_folder_of_python_files_is_a_package():
    """__init__.py all the way down: test modules of one basename in two folders are two modules."""
    folders = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    folders |= {parent for f in folders for parent in f.parents if parent.is_relative_to(TESTS)}
    assert sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").is_file()) == []


def test_no_test_module_imports_another():
    """Shared code lives in tests/support; a test module imports it from there, never from another test."""
    found = []
    for path in sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            if any(part.startswith("test_") for name in names for part in name.split(".")):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []
