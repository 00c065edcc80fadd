"""The judge endpoints in the chart (issue 41, item 4; docs/judge.md): declared by the operator under
`tenants.judges`, rendered into the tenants file the server and the report workers read (and that
decodebench's own TenantsFile accepts), each key a Secret mounted in the report workers only — never in
the controller pod a tenant may exec into, nor in the GPU workers or the server. Real helm."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.support.chart import VALUES_BY_NAME, find, pod_specs, render, render_error
from worker.core.tenants import TenantsFile

BASE = yaml.safe_load(VALUES_BY_NAME["report-workers"].read_text())
JUDGES = [
    {"name": "big-judge", "url": "http://vllm-judge.judges:8000/v1", "api_key_file": "/secrets/judge/key",
     "secret": "judge-key"},
    {"name": "open-judge", "url": "http://llama.judges:8080/v1"},
]  # fmt: skip


def with_judges(judges=JUDGES, team_a=("big-judge",), team_b=("open-judge",)) -> dict:
    values = copy.deepcopy(BASE)
    values["tenants"]["judges"] = judges
    values["tenants"]["tenants"][0]["judges"] = list(team_a)
    values["tenants"]["tenants"][1]["judges"] = list(team_b)
    return values


def test_the_tenants_file_declares_the_judges_and_decodebench_accepts_it():
    docs = render(with_judges())
    (configmap,) = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"].endswith("-tenants")]
    file = TenantsFile.model_validate(yaml.safe_load(configmap["data"]["tenants.yaml"]))
    assert [j.name for j in file.judges] == ["big-judge", "open-judge"]
    assert file.judge("big-judge").api_key_file == "/secrets/judge/key"
    assert [t.judges for t in file.tenants] == [["big-judge"], ["open-judge"]]


def test_a_judges_key_is_mounted_in_the_report_workers_only():
    docs = render(with_judges())
    mounted = {}
    for name, spec in pod_specs(docs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            for m in container.get("volumeMounts", []):
                if m["name"].startswith("judge-key"):
                    mounted[name] = (m, volumes[m["name"]])
    assert list(mounted) == ["db-decodebench-report-worker"], mounted
    mount, volume = mounted["db-decodebench-report-worker"]
    assert mount["mountPath"] == "/secrets/judge" and mount["readOnly"] is True
    assert volume["secret"] == {"secretName": "judge-key", "items": [{"key": "key", "path": "key"}]}


BAD = {
    "undeclared": (
        with_judges(team_a=("big-judge", "nope")),
        "tenants.tenants[0].judges: nope is not a declared judge endpoint (tenants.judges)",
    ),
    "twice": (with_judges(judges=[JUDGES[1], JUDGES[1]], team_a=(), team_b=()), "open-judge is declared twice"),
    "secret-without-file": (
        with_judges(judges=[{**JUDGES[1], "secret": "k"}], team_a=(), team_b=()),
        "tenants.judges[0] (open-judge): set both secret (a Secret holding the key) and api_key_file",
    ),
    "same-directory": (
        with_judges(judges=[JUDGES[0], {**JUDGES[1], "api_key_file": "/secrets/judge/other", "secret": "k2"}]),
        "tenants.judges[1].api_key_file: /secrets/judge is already the directory of big-judge's key",
    ),
    "over-the-tenants-file": (
        with_judges(judges=[{**JUDGES[0], "api_key_file": "/etc/decodebench/key"}], team_b=()),
        "would be mounted over /etc/decodebench",
    ),
    "key-in-an-env-var": (
        with_judges(judges=[{**JUDGES[1], "api_key_env": "JUDGE_KEY"}], team_a=()),
        "Additional property api_key_env is not allowed",
    ),
}


@pytest.mark.parametrize("values,needle", BAD.values(), ids=BAD.keys())
def test_bad_judge_values_are_refused_in_one_line(values, needle):
    assert needle in render_error(values)
