"""The shape of the code (tests included): no import cycles, modules and functions a reader can take in,
and a command line that starts without the heavy libraries.

The layering rules themselves are import-linter contracts in pyproject.toml, checked by
`lint-imports` in `make test`; docs/architecture.md explains them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repo import REPO

pytestmark = pytest.mark.pure

PACKAGES = ("controller", "worker")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# Functions allowed to be longer, each with its reason (documented in the function's module): none now.
LONG_FUNCTIONS: dict[tuple[str, str], str] = {}


def sources() -> list[Path]:
    """The project's Python files (not airspeed velocity's environments under benchmarks/.asv)."""
    found = (p for pkg in (*PACKAGES, "benchmarks", "examples", "tests") for p in (REPO / pkg).rglob("*.py"))
    return sorted(p for p in found if ".asv" not in p.relative_to(REPO).parts)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_tarjan_finds_a_cycle_and_only_cycles():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """Every import counts, also those inside functions (grimp reads them all); the benchmarks too."""
    import grimp

    graph = grimp.build_graph(*PACKAGES, "benchmarks", cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & graph.modules for m in graph.modules}
    assert strongly_connected(edges) == []


MAX_REPORT_FLOORS = 11  # docs/architecture.md: the report was 14 modules deep in one folder


def floors(edges: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's longest chain of imports down to one that imports none of them (the graph has no cycle)."""
    chains: dict[str, list[str]] = {}

    def chain(m: str) -> list[str]:
        if m not in chains:
            chains[m] = [m, *max((chain(d) for d in edges[m]), key=len, default=[])]
        return chains[m]

    for m in edges:
        chain(m)
    return chains


def test_the_report_stands_in_few_floors():
    """The longest chain of imports between controller.report's modules (every import counts; a package's
    face, its __init__, is not a floor): rooms in flow order keep it short."""
    import grimp

    graph = grimp.build_graph("controller", cache_dir=None)  # a stale cache hid a new floor
    report = {m for m in graph.modules if m.startswith("controller.report.")}
    modules = {m for m in report if not any(o.startswith(m + ".") for o in report)}
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    deepest = max(floors(edges).values(), key=len)
    assert len(deepest) <= MAX_REPORT_FLOORS, " > ".join(deepest)


def test_modules_stay_readable_in_one_sitting():
    long = {str(p.relative_to(REPO)): n for p in sources() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines"


def test_functions_stay_short():
    long = {}
    for path in sources():
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and (rel, node.name) not in LONG_FUNCTIONS:
                    long[f"{rel}:{node.name}"] = lines
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines (or list them in LONG_FUNCTIONS with a reason)"


def imported_by(code: str) -> set[str]:
    """Top-level packages a fresh interpreter has loaded after running `code` (the last line it prints: what
    `code` printed before, a strategy's description say, is not a module)."""
    probe = f"import sys\n{code}\nprint('\\n' + ' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.splitlines()[-1].split())


@pytest.mark.parametrize("argv", [["--help"], ["strategies"], ["run", "--help"], ["report", "--help"]])
def test_the_command_line_starts_without_heavy_libraries(argv):
    """`decodebench --help` (and listing strategies) loads neither pandas nor torch nor transformers."""
    code = (
        "from controller.cli import main\n"
        f"try:\n    main({argv!r}, standalone_mode=False)\nexcept SystemExit:\n    pass"
    )
    heavy = imported_by(code) & {"pandas", "torch", "transformers", "plotly", "pyarrow", "sacrebleu"}
    assert heavy == set()


def test_the_worker_help_starts_without_torch():
    code = (
        "from worker.cli import main\ntry:\n    main(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass"
    )
    assert imported_by(code) & {"torch", "transformers", "pandas"} == set()
