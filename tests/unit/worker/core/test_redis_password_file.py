"""DECODEBENCH_REDIS_PASSWORD_FILE against a real redis-server with passwords: the password in the
file replaces the URL's, the URL's user stays, a rotated file is read on reconnect, and a file
that cannot be read is one line naming the variable (never the password).
"""

from __future__ import annotations

import secrets

import pytest
import redis

from controller.ops.cluster import queue_stats
from tests.support.services import redis_server
from worker.core.errors import ServiceError, UsageError
from worker.core.redisconn import connect, connect_patiently, redis_user

ADMIN_PW = "admin-" + secrets.token_hex(8)
WORKER_PW = "worker-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    acl = tmp_path_factory.mktemp("pwfile") / "users.acl"
    acl.write_text(
        f"user default on >{ADMIN_PW} ~* &* +@all\n"
        f"user worker on >{WORKER_PW} ~* &* +@all -@dangerous +info +client|setname +client|list\n"
    )
    with redis_server(aclfile=str(acl)) as (url, _):
        yield url.removeprefix("redis://")  # host:port/0


@pytest.fixture()
def pwfile(tmp_path, monkeypatch):
    path = tmp_path / "password"
    monkeypatch.setenv("DECODEBENCH_REDIS_PASSWORD_FILE", str(path))
    return path


def test_the_file_s_password_logs_in_the_url_s_user(server, pwfile):
    pwfile.write_text(WORKER_PW + "\n")  # a Secret file may end in a newline
    conn = connect(f"redis://worker@{server}")
    assert conn.acl_whoami() == "worker"
    assert redis_user(f"redis://worker@{server}") == "worker"  # the audit line names it
    pwfile.write_text(ADMIN_PW)
    assert connect(f"redis://{server}").acl_whoami() == "default"


def test_the_file_replaces_a_password_in_the_url(server, pwfile):
    pwfile.write_text(WORKER_PW)
    assert connect(f"redis://worker:not-the-password@{server}").acl_whoami() == "worker"


def test_without_the_setting_the_url_s_password_is_used(server, monkeypatch):
    monkeypatch.delenv("DECODEBENCH_REDIS_PASSWORD_FILE", raising=False)
    assert connect(f"redis://worker:{WORKER_PW}@{server}").acl_whoami() == "worker"
    assert redis_user(f"redis://worker@{server}") is None  # no password anywhere: not logged in as it
    with pytest.raises(ServiceError):
        connect(f"redis://worker@{server}")


def test_a_wrong_password_in_the_file_is_refused_without_showing_it(server, pwfile):
    wrong = "wrong-" + secrets.token_hex(8)
    pwfile.write_text(wrong)
    with pytest.raises(ServiceError) as info:
        connect(f"redis://worker@{server}")
    assert wrong not in str(info.value) and WORKER_PW not in str(info.value)
    with pytest.raises(ServiceError) as info:
        queue_stats(f"redis://worker@{server}")  # `decodebench cluster status` opens Redis the same way
    assert wrong not in str(info.value)


def test_a_missing_file_is_one_line_naming_the_variable(server, pwfile):
    with pytest.raises(UsageError, match=r"^DECODEBENCH_REDIS_PASSWORD_FILE=.*password: cannot read the Redis"):
        connect(f"redis://worker@{server}")


def test_a_rotated_password_is_read_again_on_reconnect(server, pwfile):
    pwfile.write_text(WORKER_PW)
    conn = connect_patiently(f"redis://worker@{server}")
    assert conn.ping()
    admin = redis.Redis.from_url(f"redis://default:{ADMIN_PW}@{server}")
    new = "rotated-" + secrets.token_hex(8)
    admin.acl_setuser("worker", enabled=True, passwords=[f"+{new}", f"-{WORKER_PW}"])
    try:
        pwfile.write_text(new)
        admin.client_kill_filter(user="worker")  # as a Redis restart would
        assert conn.ping() and conn.acl_whoami() == "worker"  # reconnected with the new password
    finally:
        admin.acl_setuser("worker", enabled=True, passwords=[f"+{WORKER_PW}", f"-{new}"])
