"""`decodebench tenants acl`: the Redis ACL file of a tenants file.

- one user per tenant: only its own keys (`worker.core.keys.acl_keys`: exact queue and
  registry names, globs only after a ':'), only the commands the controller's submit,
  status, cancel, retry, logs and doctor send, SADD on RQ's queue set and nothing else
  there, no pub/sub channel (cancel reaches running jobs through the sweep's flag);
- `worker`: every key and channel, every command but the dangerous ones (FLUSHALL, KEYS,
  CONFIG, ...), plus the few RQ and `rq info` need;
- `keda`: read-only TYPE, LLEN and ZCARD on decodebench's queues and started-job registries
  (KEDA's redis scaler asks a key's TYPE, then LLEN for a list, ZCARD for a sorted set: the
  chart's ScaledObjects sum waiting and running jobs);
- the default user off.

Passwords are read from the environment variables the tenants file names and written as
SHA-256 hashes (`#<hex>`), never in clear.
"""

from __future__ import annotations

import hashlib
import os

from worker.core import keys
from worker.core.errors import UsageError
from worker.core.tenants import TenantsFile

# What the controller sends (redis-py and RQ included): a test runs submit, status,
# cancel, retry, logs and doctor as a tenant user under exactly this list.
TENANT_COMMANDS = (
    "ping", "echo", "multi", "exec", "discard",
    "evalsha", "script|load", "script|exists",
    "exists", "del", "expire", "ttl", "type",
    "get", "set",
    "hget", "hset", "hsetnx", "hdel", "hgetall", "hmget", "hlen", "hscan", "hexists", "hincrby",
    "zadd", "zrem", "zrange", "zrangebyscore", "zcard", "zscore",
    "lrange", "llen", "rpush", "lpush", "ltrim",
)  # fmt: skip
# Commands a worker may not send (beyond -@dangerous), and those RQ needs from that category.
WORKER_DENY = ("-@dangerous",)
WORKER_ALLOW = ("+client|setname", "+client|info", "+client|list", "+info")
KEDA_COMMANDS = ("ping", "hello", "select", "type", "llen", "zcard")


def password_hash(env_var: str | None, who: str) -> str:
    """`#<sha256>` of the password in `env_var`; UsageError naming the variable (never its value)."""
    if not env_var:
        raise UsageError(f"{who}: no redis_password_env in the tenants file")
    value = os.environ.get(env_var)
    if not value:
        raise UsageError(f"{who}: environment variable {env_var} is not set")
    return "#" + hashlib.sha256(value.encode()).hexdigest()


def tenant_rule(name: str, pw: str) -> str:
    k = keys.acl_keys(name)
    patterns = [f"~{p}" for p in k["rw"]] + [f"%R~{p}" for p in k["r"]]
    commands = " ".join(f"+{c}" for c in TENANT_COMMANDS)
    # A selector grants SADD on RQ's queue set and nothing else on that key.
    return (
        f"user {name} on {pw} resetkeys resetchannels -@all {' '.join(patterns)} {commands} (~{keys.RQ_QUEUES} +sadd)"
    )


def render_acl(tenants: TenantsFile) -> str:
    """The ACL file (one `user` line each), passwords hashed from the referenced variables."""
    lines = []  # an ACL file holds `user` lines only (no comments)
    lines.append("user default off resetpass resetkeys resetchannels -@all")
    for t in tenants.tenants:
        lines.append(tenant_rule(t.name, password_hash(t.redis_password_env, f"tenant {t.name}")))
    worker_pw = password_hash(tenants.worker.redis_password_env, "worker")
    lines.append(f"user worker on {worker_pw} ~* &* +@all {' '.join(WORKER_DENY)} {' '.join(WORKER_ALLOW)}")
    keda_pw = password_hash(tenants.keda.redis_password_env, "keda")
    keda_cmds = " ".join(f"+{c}" for c in KEDA_COMMANDS)
    queues = f"%R~{keys.RQ_QUEUE_PREFIX}{keys.QUEUE_PREFIX}.* %R~{keys.rq_registry_key('wip', keys.QUEUE_PREFIX)}.*"
    lines.append(f"user keda on {keda_pw} resetkeys resetchannels -@all {queues} {keda_cmds}")
    return "\n".join(lines) + "\n"
