"""The deployment's Redis users: a real redis-server loading `decodebench tenants acl`'s file.

Tenants hold no Redis credentials (the submission server is their only door): a tenant's name
cannot log in. The `server` user runs the real submit, status, cancel, retry, failures, logs and
list code paths under exactly its ACL; the `worker` user runs the whole life cycle; `keda` runs
KEDA's own scaler script and gets counts but cannot write; `exporter` reads what redis_exporter
reads and no key.
"""

from __future__ import annotations

import re

import pytest
import redis
from click.testing import CliRunner

from controller.cli import main as cli
from controller.launch import submit as cq
from tests.support.acl import KEDA_SCRIPT, USERS, as_user, submit_as
from tests.support.queue import spec_dict
from tests.support.repo import REPO
from tests.support.services import SIGNING_KEY as KEY
from worker import sweepstate
from worker.core import keys, rqadapter
from worker.sweepstate import reads


def denied(call) -> str:
    with pytest.raises(redis.ResponseError) as info:
        call()
    assert "NOPERM" in str(info.value) or "no permissions" in str(info.value), str(info.value)
    return str(info.value)


def test_acl_file_shape(acl):
    users = acl["admin"].acl_users()
    assert set(users) == {"default", *USERS, "admin"}
    assert "off" in acl["admin"].acl_getuser("default")["flags"]
    with pytest.raises(redis.AuthenticationError):  # nobody gets in without a user and password
        redis.Redis.from_url(acl["urls"]["anonymous"]).set("x", 1)


def test_the_acl_lines_in_docs_are_the_generated_ones(acl_redis):
    r = CliRunner().invoke(cli, ["tenants", "acl", str(acl_redis["tenants"])], env=acl_redis["env"])
    generated = re.sub(r"#[0-9a-f]{64}", "#<sha256>", r.output).splitlines()
    doc = (REPO / "docs" / "tenants.md").read_text()
    assert generated == [line for line in doc.splitlines() if line.startswith("user ")]


def test_a_tenant_cannot_log_in_at_all(acl):
    port = acl["port"]
    for user in ("team-a", "team-b", "default"):
        for password in ("nopass", *acl["passwords"].values()):
            with pytest.raises(redis.AuthenticationError):  # one connection: no retries
                redis.Connection(port=int(port), username=user, password=password).connect()
    assert {e["username"] for e in acl["admin"].acl_log()} == {"team-a", "team-b", "default"}


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (
            "tenants: [{name: a, redis_password_env: A_PW}]",
            "tenants[0].redis_password_env: tenants hold no Redis credentials (the submission server is their "
            "only door); remove it",
        ),
        (
            "tenants: [{name: a, secrets: {redis: a-redis}}]",
            "tenants[0].secrets.redis: tenants hold no Redis credentials",
        ),
    ],
)
def test_tenant_redis_credentials_are_refused_in_one_line(tmp_path, body, line):
    path = tmp_path / "tenants.yaml"
    path.write_text(body)
    for command in ("check", "acl"):
        r = CliRunner().invoke(cli, ["tenants", command, str(path)])
        assert r.exit_code == 2, r.output
        assert r.output.count("\n") == 1 and r.output.startswith(f"error: {path}: {line}"), r.output


def test_server_runs_submit_status_cancel_retry_failures_logs_list_under_its_acl(acl, tmp_path):
    """The server's code paths as `server`, for two tenants; Redis logs no denial (ACL LOG)."""
    from worker.store import FileStore

    store = FileStore(tmp_path / "runs")
    conn = as_user(acl, "server")
    a = submit_as(acl, "team-a", store, name="a-sweep")
    b = submit_as(acl, "team-b", store)
    assert a.enqueued and b.enqueued
    again = submit_as(acl, "team-a", store, name="a-sweep")  # the same sweep: nothing twice
    assert again.sweep_id == a.sweep_id and not again.enqueued
    assert sweepstate.submitted_sweeps(conn, "team-a") == [a.sweep_id]  # list
    assert sweepstate.resolve_sweep(conn, "team-a", a.sweep_id[:8]) == a.sweep_id
    status = sweepstate.read_status(conn, "team-a", a.sweep_id)  # status, failures
    assert status.total("queued") == len(a.enqueued)
    job = a.enqueued[0]
    assert sweepstate.find_job_sweep(conn, "team-a", job) == a.sweep_id  # logs finds the job's sweep
    assert sweepstate.job_state(conn, "team-a", a.sweep_id, job) == "queued"
    out = sweepstate.cancel_sweep(conn, "team-a", a.sweep_id)  # cancel
    assert out.cancelled == len(a.enqueued)
    assert sweepstate.read_status(conn, "team-a", a.sweep_id).total("cancelled") == len(a.enqueued)
    r = cq.retry(conn, store, "team-a", a.sweep_id, key=KEY)  # retry
    assert sorted(r.enqueued) == sorted(a.enqueued)
    assert reads.tenant_overview(conn, "team-b").queued == len(b.enqueued)  # status --all-tenants
    assert reads.known_tenants(conn) == ["team-a", "team-b"]
    # Not one command or key was refused on the way (CLIENT SETINFO: redis-py ignores its refusal).
    assert [e for e in acl["admin"].acl_log() if e["object"] != "client|setinfo"] == []
    # What the server may not do: the keyspace, the server, workers' channels and RQ's worker keys.
    denied(lambda: conn.keys("*"))
    denied(lambda: conn.scan(0))
    denied(lambda: conn.flushall())
    denied(lambda: conn.config_set("appendonly", "no"))
    denied(lambda: conn.publish("rq:pubsub:w", "{}"))
    denied(lambda: conn.hgetall("rq:worker:w"))
    denied(lambda: conn.set("other:key", 1))
    denied(lambda: conn.acl_setuser("server", commands=["+@all"]))
    denied(lambda: conn.execute_command("SCRIPT", "KILL"))
    # A model's unavailable mark fails a sweep's jobs: workers write it, the server only reads it (status).
    mark = keys.unavailable("team-a", a.sweep_id)
    assert sweepstate.mark_unavailable(as_user(acl, "worker"), "team-a", a.sweep_id, "/m/bad", "cannot load")
    assert [u[0] for u in sweepstate.read_status(conn, "team-a", a.sweep_id).unavailable] == ["/m/bad"]
    denied(lambda: conn.hset(mark, "/m/good", "x forged"))
    denied(lambda: conn.delete(mark))
    denied(lambda: sweepstate.mark_unavailable(conn, "team-a", a.sweep_id, "/m/good", "forged"))


def test_keda_runs_kedas_own_script_and_gets_counts_but_cannot_write(acl, tmp_path):
    from worker.store import FileStore

    b = submit_as(acl, "team-b", FileStore(tmp_path / "runs"))
    keda = as_user(acl, "keda")
    admin = acl["admin"]
    queue = keys.queue_name("team-b")
    wip, scheduled = keys.rq_registry_key("wip", queue), keys.rq_registry_key("scheduled", queue)
    admin.zadd(wip, {"j1": 1, "j2": 2})
    admin.zadd(scheduled, {"j3": 1})
    assert keda.eval(KEDA_SCRIPT, 1, keys.rq_queue_key(queue)) == len(b.enqueued)  # a list
    assert keda.eval(KEDA_SCRIPT, 1, wip) == 2  # a sorted set
    assert keda.eval(KEDA_SCRIPT, 1, scheduled) == 1
    assert keda.eval(KEDA_SCRIPT, 1, keys.rq_queue_key(keys.queue_name("team-a"))) == 0  # none yet
    # Writes inside a script are refused (only TYPE and the four counts are granted) ...
    for script in (
        "return redis.call('del', KEYS[1])",
        "return redis.call('rpush', KEYS[1], 'forged')",
        "return redis.call('lpop', KEYS[1])",
        "return redis.call('zrem', KEYS[1], 'j1')",
    ):
        with pytest.raises(redis.ResponseError, match="can.t run this command|NOPERM|no permissions"):
            keda.eval(script, 1, keys.rq_queue_key(queue))
    with pytest.raises(redis.ResponseError, match="can.t run this command|NOPERM|no permissions"):
        keda.eval("return redis.call('lrange', KEYS[1], 0, -1)", 1, keys.rq_queue_key(queue))  # payload ids
    # ... as are other keys, through the script or not, and every other command.
    denied(lambda: keda.eval(KEDA_SCRIPT, 1, keys.sweep("team-b", b.sweep_id, "meta")))
    denied(lambda: keda.eval(KEDA_SCRIPT, 1, keys.rq_job_key("team-b", b.enqueued[0])))
    denied(lambda: keda.lrange(keys.rq_queue_key(queue), 0, -1))
    denied(lambda: keda.rpush(keys.rq_queue_key(queue), "x"))
    denied(lambda: keda.evalsha("0" * 40, 0))
    denied(lambda: keda.script_load("return 1"))
    denied(lambda: keda.keys("*"))
    assert admin.llen(keys.rq_queue_key(queue)) == len(b.enqueued) and admin.zcard(wip) == 2


def test_exporter_reads_server_metrics_and_no_key(acl, tmp_path):
    from worker.store import FileStore

    b = submit_as(acl, "team-b", FileStore(tmp_path / "runs"))
    ex = as_user(acl, "exporter")
    assert "redis_version" in ex.info()
    assert "used_memory" in ex.info("memory")
    assert "maxmemory" in ex.config_get("maxmemory")
    assert isinstance(ex.slowlog_get(1), list) and ex.slowlog_len() >= 0
    ex.execute_command("LATENCY", "LATEST")
    ex.execute_command("LATENCY", "HISTOGRAM")
    assert ex.memory_stats()
    ex.client_setname("redis_exporter")
    queue_key = keys.rq_queue_key(keys.queue_name("team-b"))
    denied(lambda: ex.llen(queue_key))
    denied(lambda: ex.type(queue_key))
    denied(lambda: ex.get(keys.sweeps("team-b")))
    denied(lambda: ex.hgetall(keys.rq_job_key("team-b", b.enqueued[0])))
    denied(lambda: ex.memory_usage(queue_key))
    denied(lambda: ex.scan(0))
    denied(lambda: ex.dbsize())
    denied(lambda: ex.eval("return 1", 0))
    denied(lambda: ex.config_set("maxmemory", "1"))
    denied(lambda: ex.slowlog_reset())
    denied(lambda: ex.client_list())
    denied(lambda: ex.publish("rq:pubsub:w", "{}"))


def test_worker_user_runs_the_life_cycle_and_rq_info(acl, tmp_path, tiny_model, monkeypatch):
    """submit/status/cancel/retry as `server` (CLI), jobs run by an in-process worker as `worker`."""
    import json
    import signal

    from rq.cli import main as rq_cli

    from tests.support.worker import make_worker
    from worker.core.tenants import load_tenants

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGALRM)}
    monkeypatch.setenv("DECODEBENCH_RETRY_INTERVALS", "1,1,1")
    store = str(tmp_path / "runs")
    spec = tmp_path / "sweep.json"
    spec.write_text(json.dumps(spec_dict(tiny_model, seeds=(1,), prompts=["A", "B", "C"])))
    url = acl["urls"]["server"]
    run = lambda *a: CliRunner().invoke(cli, [*a, "--tenant", "team-a", "--redis-url", url])
    r = run("submit", str(spec), "--store", store)
    assert r.exit_code == 0, r.output
    sweep_id = re.search(r"sweep (\w+) submitted", r.output).group(1)
    audit = [line for line in r.output.splitlines() if "audit" in line]
    assert len(audit) == 1 and all(f in audit[0] for f in ("submit", "team-a", sweep_id, "user=redis:server")), r.output
    r = run("cancel", sweep_id)
    assert r.exit_code == 0 and "action=cancel" in r.output, r.output
    r = run("retry", sweep_id, "--failed", "--store", store)
    assert r.exit_code == 0 and "4 failed or cancelled jobs enqueued again" in r.output, r.output
    assert "action=retry" in r.output and acl["passwords"]["server"] not in r.output
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
    r = CliRunner().invoke(cli, ["status", "--all-tenants", "--redis-url", acl["urls"]["server"]])
    assert r.exit_code == 0 and "team-a" in r.output and "100.0%" in r.output, r.output


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
    # a listing does not enter a symlinked directory: no other tenant's names through it
    assert store.list("team-a/") == ["team-a/sweeps/s1/spec.json"] == sorted(store.list_versions("team-a/"))


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

    q = Queue(keys.queue_name("team-a"), connection=redis.Redis(), job_class=rqadapter.tenant_job_class("team-a"))
    assert q.key == keys.rq_queue_key(q.name) and Queue.redis_queues_keys == keys.RQ_QUEUES
    assert q.fetch_job.__self__.job_class.key_for("j") == keys.rq_job_key("team-a", "j")
    for cls, kind in ((FailedJobRegistry, "failed"), (CanceledJobRegistry, "canceled"), (StartedJobRegistry, "wip")):
        assert cls(queue=q).key == keys.rq_registry_key(kind, q.name)
    assert IntermediateQueue.get_intermediate_queue_key(q.key) == q.key + ":intermediate"


def test_the_submission_server_itself_runs_under_the_server_users_acl(acl, tmp_path, signing_key_file, tiny_model):
    """The real `decodebench serve` as `server`: submit, status, failures, list, cancel, retry,
    logs and the admin's shares through HTTP, with its rate limit and quota keys, and no denial."""
    import json

    from tests.support.server import deployment

    tenants = "tenants:\n  - {{name: team-a, models: [{model}]}}\n  - {{name: team-b}}\n"
    with deployment(tmp_path / "dep", acl["urls"]["server"], signing_key_file, tiny_model, tenants=tenants) as dep:
        spec = tmp_path / "s.json"
        spec.write_text(json.dumps(spec_dict(tiny_model)))
        env = {"DECODEBENCH_API_URL": dep.url, "DECODEBENCH_TOKEN": dep.tokens["alice"]}
        out = CliRunner().invoke(cli, ["submit", str(spec)], env=env)
        assert out.exit_code == 0, (out.output, acl["admin"].acl_log())
        sweep_id = out.output.split()[1]
        for args in (["status", sweep_id], ["failures", sweep_id], ["cancel", sweep_id], ["retry", sweep_id]):
            r = CliRunner().invoke(cli, args, env=env)
            assert r.exit_code == 0, (args, r.output)
        r = CliRunner().invoke(cli, ["logs", "0123456789abcdef", "--sweep", sweep_id], env=env)
        assert r.exit_code == 2 and "has no log yet" in r.output
        admin = {**env, "DECODEBENCH_TOKEN": dep.tokens["ops"]}
        assert CliRunner().invoke(cli, ["status", "--all-tenants"], env=admin).exit_code == 0
        with dep.client("alice") as http:
            assert http.get("/v1/sweeps").json()[0]["sweep_id"] == sweep_id
    # No command or key the server sent was refused (CLIENT SETINFO, Redis 7.2+: redis-py ignores its refusal).
    assert [e for e in acl["admin"].acl_log() if e["object"] != "client|setinfo"] == []
