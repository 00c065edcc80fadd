"""A model a sweep cannot load, marked once by a worker (issue 28: a model that cannot load fails once).

`decodebench:<t>:sweep:<id>:unavailable` (a hash, written by workers only; the server's Redis
user may read it, not write it: controller/ops/acl.py) holds per model path:

    <path>          "<epoch> <reason>"             the model failed to load: every job that needs it fails
    <path>\tjobs    number of the sweep's jobs failed for it (the first included)
    <path>\tprobe   "<epoch> <deadline> <worker>"  one worker is loading it for the first time
    <path>\tok      "<epoch>"                      it loaded once in this sweep

`epoch` is the sweep meta's `epoch`, renewed whenever submit or retry enqueues jobs, so a retry
tries a model again (a hub that was down may be up) and a mark of an earlier try is ignored.

`gate_models` (before a job runs) answers, atomically: `fail` (a model of the job is marked: fail
the job with the mark's reason, no load), `probe` (this worker loads the job's model first; the
others wait), `wait` (another worker is loading it right now) or `run`. `mark_unavailable` records
a failed load (the first reason stays); `loaded_model` a settled first load
(`reads.read_unavailable` lists the marks). The job failures themselves go through `transition`.
"""

from __future__ import annotations

import time

from worker.core import keys
from worker.sweepstate.transitions import Lua

PROBE_S = 120  # a worker that took the first load and died on another host frees it after this long

_GATE = Lua("""
local epoch = redis.call('HGET', KEYS[2], 'epoch') or ''
for i = 5, #ARGV do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if cur and string.sub(cur, 1, #epoch + 1) == epoch .. ' ' then
    redis.call('HINCRBY', KEYS[1], ARGV[i] .. '\\tjobs', 1)
    return {'fail', ARGV[i], string.sub(cur, #epoch + 2)}
  end
end
local p = ARGV[5]
if redis.call('HGET', KEYS[1], p .. '\\tok') == epoch then return {'run'} end
local probe = redis.call('HGET', KEYS[1], p .. '\\tprobe')
if probe then
  local e, deadline, who = string.match(probe, '^(%S*) (%S+) (.*)$$')
  if e == epoch and tonumber(deadline) > tonumber(ARGV[1]) and who ~= ARGV[3] and who ~= ARGV[4] then
    return {'wait', p, who}
  end
end
redis.call('HSET', KEYS[1], p .. '\\tprobe', epoch .. ' ' .. (tonumber(ARGV[1]) + tonumber(ARGV[2])) .. ' ' .. ARGV[3])
local ttl = redis.call('TTL', KEYS[3])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return {'probe'}
""")

_MARK = Lua("""
local epoch = redis.call('HGET', KEYS[2], 'epoch') or ''
redis.call('HDEL', KEYS[1], ARGV[1] .. '\\tprobe')
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and string.sub(cur, 1, #epoch + 1) == epoch .. ' ' then
  redis.call('HINCRBY', KEYS[1], ARGV[1] .. '\\tjobs', 1)
  return string.sub(cur, #epoch + 2)
end
redis.call('HSET', KEYS[1], ARGV[1], epoch .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1] .. '\\tjobs', 1)
local ttl = redis.call('TTL', KEYS[3])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return ARGV[2]
""")

_LOADED = Lua("""
local epoch = redis.call('HGET', KEYS[2], 'epoch') or ''
redis.call('HDEL', KEYS[1], ARGV[1] .. '\\tprobe')
redis.call('HSET', KEYS[1], ARGV[1] .. '\\tok', epoch)
return 1
""")


def _keys(tenant: str, sweep_id: str) -> list[str]:
    return [keys.unavailable(tenant, sweep_id), *(keys.sweep(tenant, sweep_id, p) for p in ("meta", "state"))]


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def gate_models(
    conn, tenant: str, sweep_id: str, paths: list[str], worker: str, dead: str = ""
) -> tuple[str, str | None, str | None]:
    """(verdict, model path, reason) for a job that needs `paths` (its generating model first): see the module
    doc. `fail` counts the job among the model's failed jobs; `wait` gives the prober as its reason. A probe
    held by `dead` (a worker known to have died) is taken over at once."""
    out = [_text(v) for v in _GATE(conn, _keys(tenant, sweep_id), [time.time(), PROBE_S, worker, dead, *paths])]
    return out[0], (out[1] if len(out) > 1 else None), (out[2] if len(out) > 2 else None)


def mark_unavailable(conn, tenant: str, sweep_id: str, path: str, reason: str) -> str:
    """Record that `path` cannot load in this sweep; returns the reason that stands (the first one)."""
    return _text(_MARK(conn, _keys(tenant, sweep_id), [path, reason]))


def loaded_model(conn, tenant: str, sweep_id: str, path: str) -> None:
    """`path` loaded (or failed for a reason of its own, not of the model): the waiting workers go ahead."""
    _LOADED(conn, _keys(tenant, sweep_id), [path])
