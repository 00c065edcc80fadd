"""checkov (the PyPI package) on the rendered chart, default and every realistic values file.
Every finding must be accepted, with its reason, in tests/chart/checkov-accepted.yaml; an accepted
entry that no longer matches a finding must go.

checkov comes from scripts/install-checkov.sh (its own virtualenv: its pins would downgrade the
project's boto3); without it this test fails, never skips.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
from collections import defaultdict

import pytest
import yaml

from tests.support.chart import CASES, CHART_TESTS, _template
from tests.support.repo import REPO

ACCEPTED = yaml.safe_load((CHART_TESTS / "checkov-accepted.yaml").read_text())


def checkov_binary() -> str:
    for candidate in (os.environ.get("CHECKOV"), str(REPO / ".tools" / "checkov" / "bin" / "checkov")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "install-checkov.sh")], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0 or not shutil.which(proc.stdout.strip().splitlines()[-1]):
        pytest.fail(f"checkov is required and scripts/install-checkov.sh failed:\n{proc.stderr}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


def test_checkov_finds_nothing_but_the_accepted_findings(tmp_path):
    for values in CASES:
        name = "default" if values is None else values.stem
        (tmp_path / f"{name}.yaml").write_text(_template((values,), "db", "ml", REPO / "charts" / "decodebench"))
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    proc = subprocess.run(
        [checkov_binary(), "-d", str(tmp_path), "--framework", "kubernetes", "-o", "json", "--quiet", "--compact"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.stdout.strip(), proc.stderr[-2000:]
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert sum(r["summary"]["passed"] for r in reports) > 1000, "checkov ran almost no checks"
    found: dict[str, set[str]] = defaultdict(set)
    for report in reports:
        for failed in report["results"]["failed_checks"]:
            found[failed["check_id"]].add(failed["resource"])
    unaccepted = {
        (check, resource)
        for check, resources in found.items()
        for resource in resources
        if not any(fnmatch.fnmatch(resource, p) for p in ACCEPTED.get(check, {}).get("resources", []))
    }
    assert not unaccepted, (
        f"checkov findings neither fixed nor accepted in tests/chart/checkov-accepted.yaml: {sorted(unaccepted)}"
    )
    stale = sorted(set(ACCEPTED) - set(found))
    assert not stale, f"accepted checkov findings that no longer occur (remove them): {stale}"
    assert all(entry.get("reason") for entry in ACCEPTED.values())
