"""`decodebench tenants acl`: the Redis ACL file of a tenants file.

Tenants hold no Redis credentials: the submission server (`decodebench serve`) is their only
door. The users are the deployment's own:

- `server`: decodebench's keys and RQ's keys of decodebench's queues (`worker.core.keys.
  server_acl_keys`; the workers' marks of models that cannot load and their running jobs' heartbeat
  TTLs read-only, `%R~`, so that no server can forge one), only the commands submit, status, cancel,
  retry, failures, logs and list send (`SERVER_COMMANDS`; a test runs those code paths as this user), no pub/sub channel
  (cancel reaches running jobs through the sweep's flag). The server's code is trusted: it
  may load its own Lua scripts;
- `worker`: every key and channel, every command but the dangerous ones (FLUSHALL, KEYS,
  CONFIG, ...), plus the few RQ and `rq info` need;
- `keda`: KEDA's redis scaler, which sends one EVAL of a script that asks a key's TYPE, then
  its ZCARD, SCARD, HLEN or LLEN. EVAL declares its keys read-write, so the key patterns
  (`keys.keda_acl_keys`: queues, started and scheduled registries) are `~`, not `%R~`; the only
  commands the script can call are those five, none of which writes;
- `exporter`: what redis_exporter sends by default (INFO, CONFIG GET, SLOWLOG, LATENCY, ...),
  no key and no channel;
- the default user off.

Passwords are read from the environment variables the tenants file names and written as
SHA-256 hashes (`#<hex>`), never in clear. `keda` and `exporter` get a user only when the
file names their variable (no autoscaling, no metrics: no user).
"""

from __future__ import annotations

import hashlib
import os

from worker.core import keys
from worker.core.errors import UsageError
from worker.core.tenants import TenantsFile

# What the server sends (redis-py and RQ included) for submit, status, cancel, retry, failures,
# logs and list: tests/unit/controller/ops/test_tenants.py runs those code paths as `server` under exactly this list.
SERVER_COMMANDS = (
    "ping", "echo", "multi", "exec", "discard",
    "evalsha", "script|load", "script|exists",
    "exists", "del", "expire", "ttl", "type",
    "get", "set", "incrby",
    "hget", "hset", "hsetnx", "hdel", "hgetall", "hmget", "hlen", "hscan", "hexists", "hincrby", "hstrlen",
    "zadd", "zrem", "zrange", "zrangebyscore", "zcard", "zscore", "zcount",
    "lrange", "llen", "rpush", "lpush", "ltrim",
    "sadd", "smembers",
)  # fmt: skip
# Commands a worker may not send (beyond -@dangerous), and those RQ needs from that category.
WORKER_DENY = ("-@dangerous",)
WORKER_ALLOW = ("+client|setname", "+client|info", "+client|list", "+info")
# KEDA (go-redis): HELLO/AUTH, SELECT when databaseIndex > 0, PING, and EVAL of the scaler's
# script, which calls TYPE and one of ZCARD, SCARD, HLEN, LLEN (kedacore/keda
# pkg/scalers/redis_scaler.go). Not CLIENT SETINFO (Redis >= 7.2 only, so the file still loads
# into an older Redis): go-redis and redis-py ignore its refusal.
KEDA_COMMANDS = ("ping", "hello", "select", "eval", "type", "zcard", "scard", "hlen", "llen")
# redis_exporter (oliver006/redis_exporter, exporter/*.go) with its default flags. CONFIG GET
# cannot be narrowed to one parameter by an ACL; the chart's redis.conf holds no password (ACL
# users live in the aclfile, hashed). MEMORY STATS for a person debugging with this user.
EXPORTER_COMMANDS = (
    "ping", "hello", "client|setname", "info", "config|get",
    "slowlog|get", "slowlog|len", "latency|latest", "latency|histogram", "memory|stats",
)  # fmt: skip


def password_hash(env_var: str | None, who: str) -> str:
    """`#<sha256>` of the password in `env_var`; UsageError naming the variable (never its value)."""
    if not env_var:
        raise UsageError(f"{who}: no redis_password_env in the tenants file")
    value = os.environ.get(env_var)
    if not value:
        raise UsageError(f"{who}: environment variable {env_var} is not set")
    return "#" + hashlib.sha256(value.encode()).hexdigest()


def _plus(commands) -> str:
    return " ".join(f"+{c}" for c in commands)


def server_rule(pw: str) -> str:
    patterns = " ".join([*(f"~{p}" for p in keys.server_acl_keys()), *(f"%R~{p}" for p in keys.server_acl_read_keys())])
    return f"user server on {pw} resetkeys resetchannels -@all {patterns} {_plus(SERVER_COMMANDS)}"


def worker_rule(pw: str) -> str:
    return f"user worker on {pw} ~* &* +@all {' '.join(WORKER_DENY)} {' '.join(WORKER_ALLOW)}"


def keda_rule(pw: str) -> str:
    patterns = " ".join(f"~{p}" for p in keys.keda_acl_keys())
    return f"user keda on {pw} resetkeys resetchannels -@all {patterns} {_plus(KEDA_COMMANDS)}"


def exporter_rule(pw: str) -> str:
    return f"user exporter on {pw} resetkeys resetchannels -@all {_plus(EXPORTER_COMMANDS)}"


def render_acl(tenants: TenantsFile) -> str:
    """The ACL file (one `user` line each), passwords hashed from the referenced variables."""
    lines = []  # an ACL file holds `user` lines only (no comments)
    lines.append("user default off resetpass resetkeys resetchannels -@all")
    lines.append(server_rule(password_hash(tenants.server.redis_password_env, "server")))
    lines.append(worker_rule(password_hash(tenants.worker.redis_password_env, "worker")))
    if tenants.keda.redis_password_env:
        lines.append(keda_rule(password_hash(tenants.keda.redis_password_env, "keda")))
    if tenants.exporter.redis_password_env:
        lines.append(exporter_rule(password_hash(tenants.exporter.redis_password_env, "exporter")))
    return "\n".join(lines) + "\n"
