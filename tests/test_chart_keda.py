"""KEDA scales a pool on its total work: the replica count the HPA would ask for, computed from
the rendered ScaledObject for several queue states (the HPA arithmetic written out below).

KEDA turns each redis trigger into a metric (the key's LLEN for a list, ZCARD for a sorted set),
evaluates `advanced.scalingModifiers.formula` over them by trigger name, and hands the HPA that
one composite metric with an AverageValue target of `scalingModifiers.target`. The HPA then asks
for ceil(metric / target) pods, keeps the current count while metric / (target x current) is
within its 10% tolerance of 1, and clamps to [minReplicaCount, maxReplicaCount]; KEDA itself takes
a pool from 0 to 1 when the metric exceeds activationTarget and back to 0 after cooldownPeriod.
"""

from __future__ import annotations

import ast
import math

import pytest
import yaml
from redis import Redis
from rq import Queue
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from tests.helpers_chart import VALUES_BY_NAME, find, render
from worker.core import keys

HPA_TOLERANCE = 0.1  # kube-controller-manager's --horizontal-pod-autoscaler-tolerance default
PRIORITIES = ("high", "normal", "low")


def evaluate(formula: str, metrics: dict[str, float]) -> float:
    """The formula as KEDA's expr would evaluate it, for the sums of trigger names the chart writes."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return walk(node.left) + walk(node.right)
        if isinstance(node, ast.Name):
            return metrics[node.id]
        raise AssertionError(f"unexpected formula part {ast.dump(node)}")

    return walk(ast.parse(formula, mode="eval"))


def desired_replicas(so: dict, lengths: dict[str, int], current: int) -> int:
    """What KEDA + the HPA ask for, given each Redis key's length and the current replica count."""
    spec = so["spec"]
    modifiers = spec["advanced"]["scalingModifiers"]
    assert modifiers["metricType"] == "AverageValue"
    metrics = {t["name"]: lengths.get(t["metadata"]["listName"], 0) for t in spec["triggers"]}
    total = evaluate(modifiers["formula"], metrics)
    lo, hi = spec["minReplicaCount"], spec["maxReplicaCount"]
    if total <= float(modifiers["activationTarget"]):
        return lo  # KEDA deactivates the pool (to minReplicaCount, 0 here) after the cooldown
    target = float(modifiers["target"])
    if current > 0 and abs(total / (target * current) - 1) <= HPA_TOLERANCE:
        return current
    return min(hi, max(lo, 1, math.ceil(total / target)))


def waiting(tenant: str, priority: str) -> str:
    return f"rq:queue:decodebench.{tenant}.{priority}"


def running(tenant: str, priority: str) -> str:
    return f"rq:wip:decodebench.{tenant}.{priority}"


@pytest.fixture(scope="module")
def scaled_object() -> dict:
    (so,) = find(render(VALUES_BY_NAME["keda"]), "ScaledObject")  # team-a, team-b; 8 jobs per pod, max 8
    return so


EVERY_LIST = [(t, p) for t in ("team-a", "team-b") for p in PRIORITIES]


@pytest.mark.parametrize(
    ("state", "current", "expected"),
    [
        # 8 waiting in each of the 6 lists: 48 jobs, 6 pods (the old per-list triggers asked for 1).
        ({waiting(t, p): 8 for t, p in EVERY_LIST}, 1, 6),
        # The backlog taken: 4 pods each running 8, nothing waiting. The pool must not shrink.
        ({running("team-a", "normal"): 20, running("team-b", "low"): 12}, 4, 4),
        # Half running, half waiting across tenants and priorities: 3 + 5 + 16 = 24 jobs, 3 pods.
        ({waiting("team-a", "high"): 3, running("team-a", "high"): 5, waiting("team-b", "normal"): 16}, 1, 3),
        # A few jobs: one pod.
        ({waiting("team-b", "low"): 3}, 0, 1),
        # No work at all: back to minReplicaCount (0) after the cooldown.
        ({}, 3, 0),
        # More work than maxReplicaCount pods can take: clamped to 8.
        ({waiting("team-a", "normal"): 200, running("team-a", "normal"): 64}, 8, 8),
        # Within the HPA's 10% tolerance (41 jobs for 5 x 8): no change.
        ({waiting("team-a", "low"): 1, running("team-a", "low"): 40}, 5, 5),
        # Just outside it (45 for 5 x 8): ceil(45 / 8) = 6.
        ({waiting("team-a", "low"): 5, running("team-a", "low"): 40}, 5, 6),
    ],
)
def test_replicas_follow_the_pools_total_work(scaled_object, state, current, expected):
    assert desired_replicas(scaled_object, state, current) == expected


def test_every_waiting_and_running_key_of_the_pool_is_summed_once(scaled_object):
    triggers = scaled_object["spec"]["triggers"]
    names = [t["name"] for t in triggers]
    assert len(names) == len(set(names)) == 12  # 2 tenants x 3 priorities x (waiting, running)
    formula = scaled_object["spec"]["advanced"]["scalingModifiers"]["formula"]
    assert sorted(formula.split(" + ")) == sorted(names)
    assert scaled_object["spec"]["advanced"]["scalingModifiers"]["target"] == "8"  # jobsPerReplica
    # An unrelated queue (another pool's tenant) does not count.
    assert desired_replicas(scaled_object, {waiting("team-c", "normal"): 100}, 0) == 0


def test_the_keys_are_the_ones_rq_and_decodebench_use():
    """The chart names the keys itself; they must be RQ's queue list and started-job registry."""
    conn = Redis()  # no connection is made: only key names are built
    for tenant, priority in EVERY_LIST:
        name = keys.queue_name(tenant, priority)
        assert Queue(name, connection=conn).key == waiting(tenant, priority)
        assert StartedJobRegistry(name, connection=conn).key == running(tenant, priority)


def test_jobs_waiting_for_a_retry_count_only_when_asked():
    """countScheduled: RQ's scheduled registry (retries not yet due) keeps a pool from scaling to 0."""
    retrying = {f"rq:scheduled:decodebench.team-a.{p}": 3 for p in PRIORITIES}
    (plain,) = find(render(VALUES_BY_NAME["keda"]), "ScaledObject")
    assert desired_replicas(plain, retrying, 0) == 0
    values = yaml.safe_load(VALUES_BY_NAME["keda"].read_text())
    for pool in values["worker"]["pools"]:
        if pool.get("autoscaling", {}).get("enabled"):
            pool["autoscaling"]["countScheduled"] = True
    (so,) = find(render(values), "ScaledObject")
    assert len(so["spec"]["triggers"]) == 18  # 2 tenants x 3 priorities x (waiting, running, scheduled)
    assert desired_replicas(so, retrying, 0) == 2
    conn = Redis()
    assert (
        ScheduledJobRegistry(keys.queue_name("team-a"), connection=conn).key == "rq:scheduled:decodebench.team-a.normal"
    )
