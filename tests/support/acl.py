"""A real redis-server loading `decodebench tenants acl`'s file (the deployment's Redis users), its clients by
user, and KEDA's own scaler script: for the tenants, KEDA and chart tests."""

from __future__ import annotations

import secrets

import pytest
import redis
from click.testing import CliRunner

from controller.cli import main as cli
from controller.launch import submit as cq
from controller.sweep.load import parse_spec
from tests.support.queue import spec_dict
from tests.support.services import SIGNING_KEY as KEY
from tests.support.services import redis_server

TENANTS = """
tenants:
  - {name: team-a, weight: 3, max_running: 2, secrets: {s3: team-a-s3}}
  - {name: team-b, weight: 1}
server: {redis_password_env: T_SERVER_PW}
worker: {redis_password_env: T_WORKER_PW}
keda: {redis_password_env: T_KEDA_PW}
exporter: {redis_password_env: T_EXPORTER_PW}
"""
USERS = ("server", "worker", "keda", "exporter")
ADMIN_PW = secrets.token_hex(16)

# KEDA's redis scaler script, verbatim from kedacore/keda pkg/scalers/redis_scaler.go
# (NewRedisScaler, commit 8b4f083ca8c8c2baf8477e322bd4d16ac4dfa09a, file last changed in
# 04f6e3c85db083626c720ba45175d6793a8030b5). KEDA sends it with one EVAL, KEYS[1] = listName.
KEDA_SCRIPT = """
		local listName = KEYS[1]
		local listType = redis.call('type', listName).ok
		if listType == 'zset' then
			return redis.call('zcard', listName)
		elseif listType == 'set' then
			return redis.call('scard', listName)
		elseif listType == 'hash' then
			return redis.call('hlen', listName)
		elseif listType == 'list' or listType == 'none' then
			return redis.call('llen', listName)
		else
			return redis.error_reply('ERR unsupported key type: ' .. listType)
		end
	"""


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    """(urls by user, admin client) of a redis-server with the deployment's ACL file."""
    tmp = tmp_path_factory.mktemp("acl")
    pw = {u: "canary-" + secrets.token_hex(12) for u in USERS}
    env = {f"T_{u.upper()}_PW": p for u, p in pw.items()}
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
        yield {"urls": urls, "passwords": pw, "env": env, "admin": admin, "port": port, "tenants": tmp / "tenants.yaml"}


@pytest.fixture()
def acl(acl_redis):
    acl_redis["admin"].flushall()
    acl_redis["admin"].acl_log_reset()
    yield acl_redis
    acl_redis["admin"].flushall()


def as_user(acl, user: str):
    return redis.Redis.from_url(acl["urls"][user])


def submit_as(acl, tenant: str, store, user: str = "server", **kw):
    return cq.submit(as_user(acl, user), store, parse_spec(spec_dict(**kw)), tenant, key=KEY)
