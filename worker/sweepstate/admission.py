"""What the submission server keeps in Redis to admit requests: per-token request counts (its
rate limit) and a per-tenant lock held while a submit checks the tenant's quota and enqueues.

The server is stateless (any number of replicas): both live in Redis, both expire on their
own, so a killed server leaves nothing that needs cleaning up.
"""

from __future__ import annotations

import secrets

from worker.core import keys
from worker.sweepstate.transitions import Lua

_RELEASE = Lua("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")


def count_request(conn, token_id: str, now: float) -> tuple[int, float]:
    """(requests of this token in the current minute, counting this one; seconds until the next minute)."""
    minute = int(now // 60)
    key = keys.rate(token_id, minute)
    with conn.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.expire(key, 120)
        n, _ = pipe.execute()
    return int(n), (minute + 1) * 60 - now


def take_submit_lock(conn, tenant: str, ttl_s: float) -> str | None:
    """An owner token if this caller now holds the tenant's submit lock, None if another does."""
    owner = secrets.token_hex(16)
    ok = conn.set(keys.submit_lock(tenant), owner, nx=True, px=max(1, int(ttl_s * 1000)))
    return owner if ok else None


def release_submit_lock(conn, tenant: str, owner: str) -> None:
    """Free the lock if this owner still holds it (it may have expired and been taken since)."""
    _RELEASE(conn, [keys.submit_lock(tenant)], [owner])
