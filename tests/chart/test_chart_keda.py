"""KEDA scales a pool on the work it can take: the replica count the HPA would ask for, computed
from the rendered ScaledObject for several queue states (the HPA arithmetic written out below),
and once from KEDA's own script run as the `keda` user against real RQ state.

KEDA turns each redis trigger into a metric (the key's LLEN for a list, ZCARD for a sorted set),
evaluates `advanced.scalingModifiers.formula` over them by trigger name (expr-lang: the chart
writes sums, comparisons and `?:`), and hands the HPA that one composite metric with an
AverageValue target of `scalingModifiers.target`. The HPA then asks for ceil(metric / target)
pods, keeps the current count while metric / (target x current) is within its 10% tolerance of
1, and clamps to [minReplicaCount, maxReplicaCount]; KEDA itself takes a pool from 0 to 1 when
the metric exceeds activationTarget and back to 0 after cooldownPeriod. Per tenant the formula
counts min(waiting + running, max(max_running, running)); pending retries count one job in all.
"""

from __future__ import annotations

import math
import re

import pytest
import yaml
from redis import Redis
from rq import Queue
from rq.registry import ScheduledJobRegistry, StartedJobRegistry

from tests.support.acl import KEDA_SCRIPT, as_user, submit_as
from tests.support.chart import VALUES_BY_NAME, find, render, render_notes
from tests.support.keda import desired_replicas, evaluate
from worker.core import keys

PRIORITIES = ("high", "normal", "low")


def waiting(tenant: str, priority: str) -> str:
    return f"rq:queue:decodebench.{tenant}.{priority}"


def running(tenant: str, priority: str) -> str:
    return f"rq:wip:decodebench.{tenant}.{priority}"


def scheduled(tenant: str, priority: str) -> str:
    return f"rq:scheduled:decodebench.{tenant}.{priority}"


@pytest.fixture(scope="module")
def scaled_object() -> dict:
    (so,) = find(render(VALUES_BY_NAME["keda"]), "ScaledObject")  # team-a, team-b; 8 jobs per pod, max 8
    return so


# The redis-server with the deployment's ACL file (test_tenants's fixtures, shared here).
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


def test_every_key_of_the_pool_is_counted_once(scaled_object):
    triggers = scaled_object["spec"]["triggers"]
    names = [t["name"] for t in triggers]
    assert len(names) == len(set(names)) == 18  # 2 tenants x 3 priorities x (waiting, running, scheduled)
    formula = scaled_object["spec"]["advanced"]["scalingModifiers"]["formula"]
    assert sorted(re.findall(r"[a-z]+_\d+_[a-z]+", formula)) == sorted(names)
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
        assert ScheduledJobRegistry(name, connection=conn).key == scheduled(tenant, priority)


def with_autoscaling(path, **autoscaling) -> dict:
    values = yaml.safe_load(path.read_text())
    for pool in values["worker"]["pools"]:
        if pool.get("autoscaling", {}).get("enabled"):
            pool["autoscaling"].update(autoscaling)
    return values


@pytest.mark.parametrize(
    ("state", "current", "expected"),
    [
        # Retries pending, nothing else: one pod stays (or comes) to move them back when due.
        ({scheduled("team-a", p): 3 for p in PRIORITIES}, 0, 1),
        ({scheduled("team-b", "low"): 1}, 2, 1),
        # Retries beside real work count one job in all (17 jobs: 3 pods), not one each (25: 4 pods).
        ({waiting("team-a", "normal"): 16, scheduled("team-a", "normal"): 9}, 1, 3),
    ],
)
def test_retries_waiting_for_their_time_keep_one_pod(scaled_object, state, current, expected):
    assert desired_replicas(scaled_object, state, current) == expected


def test_retries_count_only_while_counting_scheduled_is_on():
    (plain,) = find(render(with_autoscaling(VALUES_BY_NAME["keda"], countScheduled=False)), "ScaledObject")
    assert len(plain["spec"]["triggers"]) == 12
    assert desired_replicas(plain, {scheduled("team-a", "normal"): 3}, 1) == 0


@pytest.fixture(scope="module")
def quota_scaled_object() -> dict:
    """tenants.yaml: team-a max_running 4, team-b and research.x unbounded; 2 jobs per pod, 3 pods."""
    (so,) = find(render(with_autoscaling(VALUES_BY_NAME["tenants"], maxReplicas=20)), "ScaledObject")
    return so


@pytest.mark.parametrize(
    ("state", "current", "expected"),
    [
        # team-a may run 4 at once: 40 waiting are 4 jobs of work, 2 pods, not 20.
        ({waiting("team-a", "normal"): 40}, 0, 2),
        # 4 running and 36 waiting: still 4 (none of the 36 can start).
        ({waiting("team-a", "normal"): 36, running("team-a", "high"): 4}, 2, 2),
        # 3 running: one more can start.
        ({waiting("team-a", "low"): 36, running("team-a", "low"): 3}, 2, 2),
        # More running than the quota (it was lowered): the running ones still count.
        ({waiting("team-a", "normal"): 5, running("team-a", "normal"): 6}, 3, 3),
        # Fewer than the quota waiting: all of them.
        ({waiting("team-a", "high"): 1}, 0, 1),
        # An unbounded tenant beside it counts whole: 4 + 10 = 14 jobs, 7 pods.
        ({waiting("team-a", "normal"): 40, waiting("team-b", "normal"): 10}, 1, 7),
        ({waiting("research.x", "low"): 9}, 0, 5),
    ],
)
def test_jobs_a_quota_holds_back_start_no_pod(quota_scaled_object, state, current, expected):
    assert desired_replicas(quota_scaled_object, state, current) == expected


def test_kedas_own_script_as_the_keda_user_gives_the_counts_the_arithmetic_uses(acl, tmp_path):
    """Real RQ state on a redis-server with the deployment's ACL; every trigger's count read by
    KEDA's verbatim script as `keda`; the replicas follow, and Redis logs no refusal."""
    from worker.store import FileStore

    admin, keda = acl["admin"], as_user(acl, "keda")
    values = with_autoscaling(VALUES_BY_NAME["tenants"], maxReplicas=20, jobsPerReplica=8)
    values["tenants"]["tenants"] = [{"name": "team-a", "max_running": 2}, {"name": "team-b"}]  # test_tenants's
    values["worker"]["pools"][0]["queues"] = ["team-a", "team-b"]
    (so,) = find(render(values), "ScaledObject")
    a = submit_as(acl, "team-a", FileStore(tmp_path / "runs"))  # as the server, through the real submit
    b = submit_as(acl, "team-b", FileStore(tmp_path / "runs"))
    queue = keys.queue_name("team-a")
    started = admin.lpop(keys.rq_queue_key(queue))  # one of team-a's jobs runs ...
    admin.zadd(keys.rq_registry_key("wip", queue), {started: 1})
    admin.zadd(keys.rq_registry_key("scheduled", keys.queue_name("team-b", "low")), {"retry": 2**40})
    counts = {
        t["metadata"]["listName"]: keda.eval(KEDA_SCRIPT, 1, t["metadata"]["listName"]) for t in so["spec"]["triggers"]
    }
    assert counts[waiting("team-a", "normal")] == len(a.enqueued) - 1 and counts[running("team-a", "normal")] == 1
    assert counts[waiting("team-b", "normal")] == len(b.enqueued) and counts[scheduled("team-b", "low")] == 1
    # team-a: min(waiting + running, max(2, running)) = 2 of its jobs; team-b: all; the retry: one.
    assert len(a.enqueued) > 2
    expected = 2 + len(b.enqueued) + 1
    metrics = {t["name"]: counts[t["metadata"]["listName"]] for t in so["spec"]["triggers"]}
    assert evaluate(so["spec"]["advanced"]["scalingModifiers"]["formula"], metrics) == expected
    assert desired_replicas(so, counts, 0) == math.ceil(expected / 8)
    assert admin.acl_log() == []


def test_each_pool_runs_one_engine_and_scales_on_its_engines_queues_only(tmp_path):
    """A vLLM pool (`engine: vllm`) passes --engine vllm (DECODEBENCH_ENGINE), runs the vLLM image, and
    counts decodebench.<tenant>.<priority>.vllm only; the own pool keeps the queue names it had."""
    from tests.support.chart import env_of, workers

    docs = render(VALUES_BY_NAME["vllm-pool"])
    pools = workers(docs)
    for pool, engine in (("own", "decodebench"), ("vllm", "vllm")):
        deployment = pools[pool]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert env_of(container)["DECODEBENCH_ENGINE"]["value"] == engine
        assert deployment["metadata"]["annotations"]["decodebench.io/engine"] == engine
        assert ("decodebench-worker-vllm" in container["image"]) == (engine == "vllm")
        (so,) = find(docs, "ScaledObject", deployment["metadata"]["name"])
        lists = [t["metadata"]["listName"] for t in so["spec"]["triggers"]]
        queues = {name.split(":", 2)[2] for name in lists}
        assert {keys.queue_engine(q) for q in queues} == {engine}, queues
    own, vllm = (find(docs, "ScaledObject", pools[p]["metadata"]["name"])[0] for p in ("own", "vllm"))
    assert desired_replicas(vllm, {f"rq:queue:{keys.queue_name('team-a', 'normal', 'vllm')}": 20}, 0) == 2
    assert desired_replicas(own, {f"rq:queue:{keys.queue_name('team-a', 'normal', 'vllm')}": 20}, 0) == 0
    assert desired_replicas(vllm, {waiting("team-a", "normal"): 20}, 0) == 0
    notes = render_notes(VALUES_BY_NAME["vllm-pool"], tmp_path=tmp_path)
    assert "tenants: team-a, team-b\n" in notes and "tenants: team-a, engine: vllm\n" in notes
