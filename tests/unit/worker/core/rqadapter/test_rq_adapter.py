"""RQ behind one adapter (the package worker/core/rqadapter/): it is written against one rq version,
and nothing but it imports rq."""

from __future__ import annotations

import ast
import tomllib

import pytest
import rq

from tests.support.repo import REPO
from worker.core import rqadapter

pytestmark = pytest.mark.pure


def test_the_installed_rq_is_the_one_the_adapter_was_written_against():
    assert rq.__version__ == rqadapter.RQ_VERSION, (
        f"rq {rq.__version__} is installed, worker/core/rqadapter/ was written against {rqadapter.RQ_VERSION}: "
        "check every field, key and private attribute it names, then update RQ_VERSION"
    )


def test_only_the_modules_the_contract_names_import_rq():
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["id"] == "rq-behind-the-adapter"]
    allowed = {line.split(" -> ")[0] for line in contract["ignore_imports"]}
    assert all(m.startswith("worker.core.rqadapter.") for m in allowed)  # the adapter package, nothing else
    importers = set()
    for pkg in ("controller", "worker"):
        for path in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                if any(n == "rq" or n.startswith("rq.") for n in names):
                    importers.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    assert importers == allowed


# An RQ job's own bookkeeping: what RQ reads to retry a job and where it keeps a failure's reason.
RQ_JOB_FIELDS = {"meta", "save_meta", "retries_left", "number_of_retries", "retry_intervals"}


def test_no_module_outside_the_adapter_touches_an_rq_jobs_bookkeeping():
    """Issue 40, item 4: failing a job for good (no retries, its reason in RQ's meta, RQ's stand-in for
    an unreadable meta replaced) is the adapter's `fail_for_good`, not copied into each worker."""
    adapter = REPO / "worker" / "core" / "rqadapter"
    found = []
    for pkg in ("controller", "worker"):
        for path in (REPO / pkg).rglob("*.py"):
            if adapter in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in RQ_JOB_FIELDS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
                if isinstance(node, ast.Constant) and node.value == "unserialized":
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: RQ's stand-in meta")
    assert not found, found


def test_a_worker_logic_writes_only_what_is_its_own():
    """The report worker's logic leaves the defaults (round robin, refused jobs failed for good, nothing
    to cancel, reap or touch beyond the liveness file, the last line) to `WorkerLogic`; one that forgets
    its run lock cannot be built."""
    from controller.report.distribute.mapworker import ReportLogic
    from worker.core.rqadapter.logic import WorkerLogic

    required = {"claim", "release", "refusal", "running", "in_job_code", "beat"}
    assert WorkerLogic.__abstractmethods__ == required
    own = {name for name in vars(ReportLogic) if not name.startswith("_")} - {"log_name", "stopped_event"}
    assert own == required | {"attach", "refresh_queues"}
    without_lock = type("NoLock", (WorkerLogic,), {n: lambda *a: None for n in required - {"claim"}})
    with pytest.raises(TypeError, match="claim"):
        without_lock()


def test_a_jobs_place_in_its_sweep_is_named():
    from worker.core.contract import JobRef
    from worker.rq.task import job_ref

    payload = {"tenant": "team-a", "sweep_id": "s1", "job_id": "j1", "cell": "m::greedy"}
    job = type("J", (), {"args": [payload], "kwargs": {}, "instance": None})()
    ref = job_ref(job)
    assert ref == JobRef(tenant="team-a", sweep_id="s1", job_id="j1", cell="m::greedy") and ref.sweep_id == "s1"
    job.args = [payload | {"cell": 3}]
    assert job_ref(job) is None  # not a decodebench job's payload
