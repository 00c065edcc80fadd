"""RQ behind one adapter (the package worker/core/rqadapter/): it is written against one rq version,
and nothing but it imports rq."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest
import rq

from worker.core import rqadapter

pytestmark = pytest.mark.pure
ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_rq_is_the_one_the_adapter_was_written_against():
    assert rq.__version__ == rqadapter.RQ_VERSION, (
        f"rq {rq.__version__} is installed, worker/core/rqadapter/ was written against {rqadapter.RQ_VERSION}: "
        "check every field, key and private attribute it names, then update RQ_VERSION"
    )


def test_only_the_modules_the_contract_names_import_rq():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["id"] == "rq-behind-the-adapter"]
    allowed = {line.split(" -> ")[0] for line in contract["ignore_imports"]}
    assert all(m.startswith("worker.core.rqadapter.") for m in allowed)  # the adapter package, nothing else
    importers = set()
    for pkg in ("controller", "worker"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                if any(n == "rq" or n.startswith("rq.") for n in names):
                    importers.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert importers == allowed
