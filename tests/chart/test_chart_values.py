"""The chart's values: bad values fail with a readable message (the schema keeps rejecting typos
in the chart's own keys while the Kubernetes pass-through keys stay open), every value is
documented, and the realistic values files say what cluster they describe.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.support.chart import CHART, VALUES, VALUES_BY_NAME, render, render_error
from tests.support.repo import REPO

# --- bad values fail with a readable message -------------------------------------------------

BAD_VALUES = {
    "internal-and-external-redis": (
        {"redis": {"enabled": True, "external": {"url": "redis://r.example:6379/0"}}},
        "set either redis.enabled=true (Redis in the cluster) or redis.external.url",
    ),
    "no-redis": ({"redis": {"enabled": False}}, "set redis.enabled=true (Redis in the cluster) or redis.external.url"),
    "negative-replicas": (
        {"worker": {"pools": [{"name": "gpu", "replicas": -1}]}},
        "worker.pools.0.replicas: Must be greater than or equal to 0",
    ),
    "unknown-pool-field": (
        {"worker": {"pools": [{"name": "gpu", "gpu": 2}]}},
        "worker.pools.0: Additional property gpu is not allowed",
    ),
    "pool-without-name": ({"worker": {"pools": [{"gpus": 2}]}}, "worker.pools.0: name is required"),
    "duplicate-pools": ({"worker": {"pools": [{"name": "gpu"}, {"name": "gpu"}]}}, 'the pool name "gpu" appears twice'),
    "credentials-in-redis-url": (
        {"redis": {"enabled": False, "external": {"url": "redis://:hunter2@r.example:6379/0"}}},
        "redis.external.url: Does not match pattern",
    ),
    "autoscaling-all-tenants": (
        {"worker": {"pools": [{"name": "gpu", "autoscaling": {"enabled": True}}]}},
        "worker.pools[0] (gpu): autoscaling watches named queues, so `queues` must list tenants",
    ),
    "min-above-max": (
        {
            "worker": {
                "pools": [
                    {
                        "name": "gpu",
                        "queues": ["a"],
                        "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2},
                    }
                ]
            }
        },
        "autoscaling.minReplicas (5) is above autoscaling.maxReplicas (2)",
    ),
    "unpinned-digest": ({"worker": {"image": {"digest": "latest"}}}, "worker.image.digest: Does not match pattern"),
    "typo-in-section": (
        {"store": {"bucket": "b", "acessKey": "x"}},
        "store: Additional property acessKey is not allowed",
    ),
}


@pytest.mark.parametrize("case", BAD_VALUES, ids=list(BAD_VALUES))
def test_bad_values_fail_with_a_readable_message(case):
    values, message = BAD_VALUES[case]
    err = render_error(values)
    assert message in err, err
    assert "goroutine" not in err and len(err.splitlines()) < 10


# --- conventions -----------------------------------------------------------------------------


def test_every_value_has_a_doc_comment():
    """helm-docs style: each leaf value is documented by a `# --` comment on itself or a parent key."""
    undocumented, stack, pending = [], [], False
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys = []
    for line in lines:
        if line.strip().startswith("# --"):
            pending = True
            continue
        m = re.match(r"^(\s*)([A-Za-z][\w.-]*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        documented = pending or any(d for _, _, d in stack)
        keys.append((indent, ".".join([k for _, k, _ in stack] + [key]), documented, rest))
        stack.append((indent, key, pending))
        pending = False
    for i, (indent, path, documented, rest) in enumerate(keys):
        is_leaf = rest != "" or i + 1 == len(keys) or keys[i + 1][0] <= indent
        if is_leaf and not documented:
            undocumented.append(path)
    assert not undocumented, f"values without a `# --` comment: {undocumented}"


def test_chart_metadata_and_schema():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "decodebench"
    schema = CHART / "values.schema.json"
    assert schema.exists()
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    for name in ("decodebench.name", "decodebench.fullname", "decodebench.labels"):
        assert f'define "{name}"' in helpers


assert {"gpu-two-pools", "cpu-only", "external-redis", "keda", "no-networkpolicy"} <= VALUES_BY_NAME.keys()


def test_values_files_are_documented():
    for path in VALUES:
        first = path.read_text().splitlines()[0]
        assert first.startswith("#"), f"{path.name}: say in a first comment what cluster it describes"


def test_the_keda_values_in_docs_deploy_md_are_the_tested_file():
    docs = (REPO / "docs" / "deploy.md").read_text()
    after = docs.split("`values-keda.yaml`", 1)[1]
    block = after.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert yaml.safe_load(block) == yaml.safe_load(VALUES_BY_NAME["deploy-md-keda"].read_text())


def test_every_values_example_in_docs_deploy_md_renders():
    """issue 42: a reader copies these blocks; each must pass the chart's schema on its own (the `sha256:...`
    placeholder of an image digest did not). A block of chart values: its top-level keys are the chart's."""
    keys = set(json.loads((CHART / "values.schema.json").read_text())["properties"])
    docs = (REPO / "docs" / "deploy.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", docs, re.S)]
    examples = [b for b in blocks if isinstance(b, dict) and set(b) <= keys]
    assert len(examples) >= 8, "the values examples of docs/deploy.md moved: update this test"
    for values in examples:
        assert render(values), values
