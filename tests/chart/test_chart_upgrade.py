"""`helm upgrade` touches only what changed: a chart bump alone restarts no pod (no chart or app
version in pod templates: a GPU pool's rollout takes up to an hour a wave, and Redis holds the
queues), and a pod's checksums cover only what it reads (a ConfigMap's data, not its labels).

Rendered with the real helm from a copy of the chart whose Chart.yaml is bumped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.support.chart import CHART, VALUES_BY_NAME, find, render

PINNED = {
    "worker": {"image": {"tag": "1.4.2"}},
    "controller": {"image": {"tag": "1.4.2"}},
    "redis": {"aclImage": {"tag": "1.4.2"}},
}


def bumped_chart(tmp_path: Path, version: str = "9.9.9", app_version: str | None = None) -> Path:
    chart = tmp_path / "decodebench"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = version
    if app_version:
        meta["appVersion"] = app_version
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return chart


def templates(docs: list[dict]) -> dict[str, dict]:
    """Every pod template (Deployments, StatefulSets) by its owner's name."""
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


def without_generated_password(pods: dict[str, dict]) -> dict[str, dict]:
    """`helm template` generates a new Redis password each time (test_chart_secrets.py); `helm
    upgrade` looks the kept one up, so the checksum stays: left out here."""
    for pod in pods.values():
        (pod["metadata"].get("annotations") or {}).pop("checksum/password", None)
    return pods


def test_a_chart_bump_changes_no_pod_template(tmp_path):
    for name in ("gpu-two-pools", "tenants"):
        values = (VALUES_BY_NAME[name], PINNED)
        before = render(*values)
        after = render(*values, chart=bumped_chart(tmp_path / name, app_version="9.9.9"))
        assert without_generated_password(templates(before)) == without_generated_password(templates(after)), (
            f"{name}: a chart bump alone would restart pods"
        )
        # the version labels stay on the objects' own metadata
        for doc in find(after, "Deployment") + find(after, "StatefulSet"):
            assert doc["metadata"]["labels"]["helm.sh/chart"] == "decodebench-9.9.9"
            assert doc["metadata"]["labels"]["app.kubernetes.io/version"] == "9.9.9"
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert "helm.sh/chart" not in labels and "app.kubernetes.io/version" not in labels


def test_a_new_app_version_rolls_only_the_pods_whose_image_follows_it(tmp_path):
    before = without_generated_password(templates(render()))  # image tags empty: they default to the appVersion
    after = without_generated_password(templates(render(chart=bumped_chart(tmp_path, app_version="9.9.9"))))
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"db-decodebench-worker-gpu", "db-decodebench-controller", "db-decodebench-server"}
    assert "db-decodebench-redis" not in changed  # its image has its own tag: the queues stay up


def test_redis_acl_init_container_runs_the_light_acl_image():
    (sts,) = find(render(VALUES_BY_NAME["tenants"]), "StatefulSet")
    (init,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == "ghcr.io/decodebench/decodebench-acl:0.1.0"  # Dockerfile.controller --target acl


def redis_checksums(*values) -> dict[str, str]:
    (sts,) = find(render(*values), "StatefulSet")
    notes = sts["spec"]["template"]["metadata"]["annotations"]
    return {k: v for k, v in notes.items() if k.startswith("checksum/")}


def test_redis_restarts_for_a_new_config_or_new_tenants_only():
    base = redis_checksums(VALUES_BY_NAME["tenants"])
    assert set(base) == {"checksum/config", "checksum/tenants", "checksum/acl"}
    assert redis_checksums(VALUES_BY_NAME["tenants"], {"redis": {"extraConfig": "slowlog-max-len 256"}}) != base
    more = yaml.safe_load(VALUES_BY_NAME["tenants"].read_text())["tenants"]
    more["tenants"][1]["weight"] = 2
    changed = redis_checksums(VALUES_BY_NAME["tenants"], {"tenants": more})
    assert (
        changed["checksum/tenants"] != base["checksum/tenants"]
        and changed["checksum/config"] == base["checksum/config"]
    )
    # labels on the ConfigMaps are not what Redis reads
    assert redis_checksums(VALUES_BY_NAME["tenants"], {"commonLabels": {"team": "ml-platform"}}) == base
