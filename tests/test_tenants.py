"""Tenants under Redis ACLs: a real redis-server loading `decodebench tenants acl`'s file.

team-a's controller and a hand-written redis-py client logged in as team-a try, command by
command, to reach team-b; the worker user runs the whole life cycle; KEDA reads lengths only.
"""

from __future__ import annotations

import re
import secrets

import pytest
import redis
from click.testing import CliRunner

from controller.cli import main as cli
from controller.launch import submit as cq
from controller.spec.load import parse_spec
from tests.services import SIGNING_KEY as KEY
from tests.services import redis_server
from tests.test_queue import spec_dict
from worker import sweepstate
from worker.core import keys

TENANTS = """
tenants:
  - {name: team-a, weight: 3, max_running: 2, redis_password_env: T_A_PW, secrets: {redis: team-a-redis}}
  - {name: team-b, weight: 1, redis_password_env: T_B_PW}
worker: {redis_password_env: T_WORKER_PW}
keda: {redis_password_env: T_KEDA_PW}
"""
ADMIN_PW = secrets.token_hex(16)


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    """(urls by user, admin client) of a redis-server with the tenants' ACL file."""
    tmp = tmp_path_factory.mktemp("acl")
    pw = {u: "canary-" + secrets.token_hex(12) for u in ("team-a", "team-b", "worker", "keda")}
    env = {"T_A_PW": pw["team-a"], "T_B_PW": pw["team-b"], "T_WORKER_PW": pw["worker"], "T_KEDA_PW": pw["keda"]}
    (tmp / "tenants.yaml").write_text(TENANTS)
    r = CliRunner().invoke(cli, ["tenants", "acl", str(tmp / "tenants.yaml")], env=env)
    assert r.exit_code == 0, r.output
    assert not any(p in r.output for p in pw.values())  # hashed, never in clear
    acl = r.output + f"user admin on >{ADMIN_PW} ~* &* +@all\n"  # the tests' own flushing user
    (tmp / "users.acl").write_text(acl)
    with redis_server(aclfile=str(tmp / "users.acl")) as (url, _):
        port = url.rsplit(":", 1)[1].split("/")[0]
        urls = {u: f"redis://{u}:{p}@127.0.0.1:{port}/0" for u, p in pw.items()}
        urls["anonymous"] = url
        admin = redis.Redis.from_url(f"redis://admin:{ADMIN_PW}@127.0.0.1:{port}/0")
        yield {"urls": urls, "passwords": pw, "env": env, "admin": admin, "tenants": tmp / "tenants.yaml"}


@pytest.fixture()
def acl(acl_redis):
    acl_redis["admin"].flushall()
    yield acl_redis
    acl_redis["admin"].flushall()


def as_user(acl, user: str):
    return redis.Redis.from_url(acl["urls"][user])


def submit_as(acl, tenant: str, store, **kw):
    return cq.submit(as_user(acl, tenant), store, parse_spec(spec_dict(**kw)), tenant, key=KEY)


def denied(call) -> str:
    with pytest.raises(redis.ResponseError) as info:
        call()
    assert "NOPERM" in str(info.value) or "no permissions" in str(info.value), str(info.value)
    return str(info.value)


def test_acl_file_shape(acl):
    users = acl["admin"].acl_users()
    assert set(users) == {"default", "team-a", "team-b", "worker", "keda", "admin"}
    assert "off" in acl["admin"].acl_getuser("default")["flags"]
    with pytest.raises(redis.AuthenticationError):  # nobody gets in without a user and password
        redis.Redis.from_url(acl["urls"]["anonymous"]).set("x", 1)


def test_team_a_cannot_reach_team_b_command_by_command(acl, tmp_path):
    from worker.store import FileStore

    store = FileStore(tmp_path / "runs")
    b = submit_as(acl, "team-b", store)
    a = submit_as(acl, "team-a", store, name="a-sweep")
    assert a.enqueued and b.enqueued
    me = as_user(acl, "team-a")
    b_meta, b_state = keys.sweep("team-b", b.sweep_id, "meta"), keys.sweep("team-b", b.sweep_id, "state")
    b_queue = keys.rq_queue_key(keys.queue_name("team-b"))
    b_job = keys.rq_job_key("team-b", b.enqueued[0])
    # team-a's own keys work: the refusals below are about team-b, not a broken user
    assert me.hgetall(keys.sweep("team-a", a.sweep_id, "meta"))
    assert me.llen(keys.rq_queue_key(keys.queue_name("team-a"))) == len(a.enqueued)
    assert me.hgetall(keys.rq_job_key("team-a", a.enqueued[0]))
    # read
    denied(lambda: me.hgetall(b_meta))
    denied(lambda: me.hget(b_state, b.enqueued[0]))
    denied(lambda: me.lrange(b_queue, 0, -1))
    denied(lambda: me.llen(b_queue))
    denied(lambda: me.hgetall(b_job))  # RQ job payload (the prompts) of team-b
    denied(lambda: me.zrange(keys.sweeps("team-b"), 0, -1))
    denied(lambda: me.smembers(keys.RQ_QUEUES))  # may only SADD there
    # write, delete, enqueue
    denied(lambda: me.hset(b_meta, "cancelled", "1"))
    denied(lambda: me.delete(b_meta))
    denied(lambda: me.delete(b_job))
    denied(lambda: me.rpush(b_queue, "forged"))
    denied(lambda: me.lpop(b_queue))
    denied(lambda: me.hset(keys.rq_job_key("team-b", "forged"), "data", "x"))
    denied(lambda: me.srem(keys.RQ_QUEUES, b_queue))
    denied(lambda: me.delete(keys.RQ_QUEUES))
    denied(lambda: me.zrem(keys.slots("team-a"), "x"))  # its own quota belongs to the workers
    denied(lambda: me.zadd(keys.running("team-a"), {"x": 1}))  # read-only for the tenant
    # through Lua: declared and undeclared keys are both checked
    denied(lambda: me.eval("return redis.call('HGETALL', KEYS[1])", 1, b_meta))
    denied(lambda: me.eval("return redis.call('DEL', ARGV[1])", 0, b_job))
    # the whole keyspace and the server
    denied(lambda: me.flushall())
    denied(lambda: me.flushdb())
    denied(lambda: me.keys("*"))
    denied(lambda: me.scan(0))
    denied(lambda: me.execute_command("RANDOMKEY"))
    denied(lambda: me.config_set("appendonly", "no"))
    denied(lambda: me.publish(f"rq:pubsub:{'w'}", "{}"))  # stop-job commands to any worker
    denied(lambda: me.execute_command("SELECT", 1))
    denied(lambda: me.acl_setuser("team-a", commands=["+@all"]))
    # the controller's own code on team-b's sweep, past the CLI's check: Redis refuses
    denied(lambda: sweepstate.read_status(me, "team-b", b.sweep_id))
    denied(lambda: sweepstate.cancel_sweep(me, "team-b", b.sweep_id))
    admin = acl["admin"]
    assert admin.llen(b_queue) == len(b.enqueued) and not admin.hget(b_meta, "cancelled")


def test_cli_as_team_a_refuses_team_b_in_one_line(acl, tmp_path):
    from worker.store import FileStore

    b = submit_as(acl, "team-b", FileStore(tmp_path / "runs"))
    url = acl["urls"]["team-a"]
    for args in (["status", b.sweep_id], ["cancel", b.sweep_id], ["retry", b.sweep_id, "--failed", "--store", "x"]):
        r = CliRunner().invoke(cli, [*args, "--tenant", "team-b", "--redis-url", url])
        assert r.exit_code == 2, r.output
        assert r.output.strip().splitlines() == [
            "error: connected to Redis as tenant 'team-a': it may not act on the sweeps of tenant 'team-b'"
        ]
        assert acl["passwords"]["team-a"] not in r.output


def test_keda_reads_queue_lengths_only(acl, tmp_path):
    from worker.store import FileStore

    b = submit_as(acl, "team-b", FileStore(tmp_path / "runs"))
    keda = as_user(acl, "keda")
    assert keda.llen(keys.rq_queue_key(keys.queue_name("team-b"))) == len(b.enqueued)
    # What KEDA's redis scaler sends for the chart's waiting (list) and running (sorted set) triggers.
    assert keda.type(keys.rq_queue_key(keys.queue_name("team-b"))) == b"list"
    assert keda.zcard(keys.rq_registry_key("wip", keys.queue_name("team-b"))) == 0
    denied(lambda: keda.zrange(keys.rq_registry_key("wip", keys.queue_name("team-b")), 0, -1))
    denied(lambda: keda.lrange(keys.rq_queue_key(keys.queue_name("team-b")), 0, -1))
    denied(lambda: keda.rpush(keys.rq_queue_key(keys.queue_name("team-b")), "x"))
    denied(lambda: keda.hgetall(keys.sweep("team-b", b.sweep_id, "meta")))
    denied(lambda: keda.keys("*"))


def test_worker_user_runs_the_life_cycle_and_rq_info(acl, tmp_path, tiny_model, monkeypatch):
    """submit/status/cancel/retry as team-a (CLI), jobs run by an in-process worker as `worker`."""
    import json
    import signal

    from rq.cli import main as rq_cli

    from tests.test_worker import make_worker
    from worker.core.tenants import load_tenants

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGALRM)}
    monkeypatch.setenv("DECODEBENCH_RETRY_INTERVALS", "1,1,1")
    store = str(tmp_path / "runs")
    spec = tmp_path / "sweep.json"
    spec.write_text(json.dumps(spec_dict(tiny_model, seeds=(1,), prompts=["A", "B", "C"])))
    url = acl["urls"]["team-a"]
    run = lambda *a: CliRunner().invoke(cli, [*a, "--tenant", "team-a", "--redis-url", url])
    r = run("submit", str(spec), "--store", store)
    assert r.exit_code == 0, r.output
    sweep_id = re.search(r"sweep (\w+) submitted", r.output).group(1)
    audit = [line for line in r.output.splitlines() if "audit" in line]
    assert len(audit) == 1 and all(f in audit[0] for f in ("submit", "team-a", sweep_id, "user=team-a")), r.output
    r = run("cancel", sweep_id)
    assert r.exit_code == 0 and "action=cancel" in r.output, r.output
    r = run("retry", sweep_id, "--failed", "--store", store)
    assert r.exit_code == 0 and "4 failed or cancelled jobs enqueued again" in r.output, r.output
    assert "action=retry" in r.output and acl["passwords"]["team-a"] not in r.output
    from worker.store import open_store

    wconn = as_user(acl, "worker")
    try:
        worker = make_worker(wconn, ["*"], store=open_store(store), tenants=load_tenants(acl["tenants"]))
        worker.work(burst=True)
        r = CliRunner().invoke(rq_cli, ["info", "--url", acl["urls"]["worker"]])
        assert r.exit_code == 0 and "decodebench.team-a.normal" in r.output, r.output
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    r = run("status", sweep_id, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["totals"]["done"] == 4
    r = CliRunner().invoke(cli, ["status", "--all-tenants", "--redis-url", acl["urls"]["worker"]])
    assert r.exit_code == 0 and "team-a" in r.output and "100.0%" in r.output, r.output
    r = run("doctor", "--store", store)
    assert "PASS  redis" in r.output, r.output


def test_file_store_keeps_each_key_inside_its_tenants_directory(tmp_path):
    from worker.core.errors import StoreError
    from worker.store import FileStore

    store = FileStore(tmp_path / "runs")
    store.write_json("team-b/sweeps/s1/spec.json", {"secret": "b"})
    store.write_json("team-a/sweeps/s1/spec.json", {"mine": "a"})
    assert store.read_json("team-a/sweeps/s1/spec.json") == {"mine": "a"}
    (tmp_path / "runs" / "team-a" / "sweeps" / "link").symlink_to(tmp_path / "runs" / "team-b" / "sweeps" / "s1")
    (tmp_path / "outside").mkdir()
    (tmp_path / "runs" / "team-a" / "sweeps" / "out").symlink_to(tmp_path / "outside")
    for key in (
        "team-a/../team-b/sweeps/s1/spec.json",
        "team-a/sweeps/../../team-b/sweeps/s1/spec.json",
        "/etc/passwd",
        str(tmp_path / "runs" / "team-b" / "sweeps" / "s1" / "spec.json"),
        "team-a/sweeps/link/spec.json",  # a symlink into another tenant
        "team-a/sweeps/out/x.json",  # a symlink out of the store
    ):
        with pytest.raises(StoreError):
            store.read_bytes(key)
        with pytest.raises(StoreError):
            store.write_bytes(key, b"x")
    assert store.read_json("team-b/sweeps/s1/spec.json") == {"secret": "b"}
    assert not (tmp_path / "outside" / "x.json").exists()


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ("tenants: [{name: a, password: hunter2}]", "tenants[0].password: unknown key"),
        ("tenants: [{name: a, weight: 0}]", "tenants[0].weight: Input should be greater than 0"),
        ("tenants: [{name: a}, {name: a}]", "tenants[1].name: duplicate tenant name 'a'"),
        ("tenants: [{name: a/b}]", "tenants[0].name: must not contain '/'"),
    ],
)
def test_bad_tenants_files_are_one_line_naming_the_field(tmp_path, body, line):
    path = tmp_path / "tenants.yaml"
    path.write_text(body)
    r = CliRunner().invoke(cli, ["tenants", "check", str(path)])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and r.output.startswith(f"error: {path}: {line}"), r.output
    assert "hunter2" not in r.output


def test_rq_key_names_match_the_installed_rq():
    from rq import Queue
    from rq.intermediate_queue import IntermediateQueue
    from rq.registry import CanceledJobRegistry, FailedJobRegistry, StartedJobRegistry

    q = Queue(keys.queue_name("team-a"), connection=redis.Redis(), job_class=keys.rq_job_class("team-a"))
    assert q.key == keys.rq_queue_key(q.name) and Queue.redis_queues_keys == keys.RQ_QUEUES
    assert q.fetch_job.__self__.job_class.key_for("j") == keys.rq_job_key("team-a", "j")
    for cls, kind in ((FailedJobRegistry, "failed"), (CanceledJobRegistry, "canceled"), (StartedJobRegistry, "wip")):
        assert cls(queue=q).key == keys.rq_registry_key(kind, q.name)
    assert IntermediateQueue.get_intermediate_queue_key(q.key) == q.key + ":intermediate"
