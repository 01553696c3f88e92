"""What a job's Redis work could cost with every guarantee's commands and nothing else: a
lean prototype of the job lifecycle, measured against taskiq and splatq in the same run.

Issue #27 asks for Redis CPU per job within 1.5x taskiq's. This bench answers "would the
guarantees themselves allow it?" by measuring a floor: three scripts (enqueue one job; take
a batch -- the fair feed folded in -- and start it; commit a batch) that issue the commands
splatq's guarantees need and no more, with a lean record (the immutable spec as one field),
driven by a worker loop in this process (no handler, no asyncio worker runtime: only the
Redis side is compared; INFO cpu is Redis's own CPU).

Kept, per job: the record (a hash); the outbox (one XADD per state change: queued,
started, completed, atomic with it); the job's history (a list item per event, its TTL);
the tenant's listing index (ZADD); fair queues (a list per tenant and a ring of tenants,
round-robin); the consumer group (XREADGROUP, XACK + XDEL: the reaper's pending list); the
lease-token fence (a token in the record, checked at commit); the resend answer
(`last_commit`, checked first); the record's retention (PEXPIRE).
Left out (splatq has them; each costs more): idempotency claims (the bench's jobs have
none, as in `bench.engine_throughput`), backlog admission bounds, tenant running caps and
deficit round-robin weights/costs, the fleet's outage accounting, lease keys, co-running
counts, replay memos, per-stage ledgers.

Usage: python -m bench.redis_floor [--jobs 5000] [--batch 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from redis.asyncio import Redis

from bench.peers import harness, splatq_noop, taskiq_noop
from splatq.shared.redis.server import RedisServer

TAG = "floor:{f0}"
RETENTION_MS = 7 * 24 * 3600 * 1000
TENANTS = 8
# What the lean floor can add, each measured alone and then all together: the tenant's
# backlog share (admission), the deficit round-robin state, running caps, a lease key beside
# the record's token, take's replay memo.
EXTRAS = ("admission", "drr", "caps", "lease", "memo")

_PREFIX = f"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function emit(outbox, job_key, f, event_id, name, extra, now)
  local payload = '{{"event":"' .. name .. '","id":"' .. event_id .. '","timestamp":'
    .. math.floor(now / 1000) .. ',"data":{{"job_id":"' .. f[1] .. '","metadata":' .. f[3]
    .. (extra ~= '' and (',' .. extra) or '') .. '}}}}'
  redis.call('XADD', outbox, 'MAXLEN', '~', 100000, '*', 'event_id', event_id, 'type', name,
    'job_id', f[1], 'tenant', f[2], 'trace_id', f[4], 'payload', payload)
  local h = job_key .. ':h'
  local n = redis.call('RPUSH', h, now .. '\\t' .. name .. '\\t' .. event_id .. '\\t' .. extra)
  if n == 1 or name == 'completed' then redis.call('PEXPIRE', h, {RETENTION_MS}) end
end
"""

# KEYS: 1 job, 2 outbox, 3 tenant's fair queue, 4 ring, 5 tenant's listing
# ARGV: 1 job id, 2 event id, 3 tenant, 4 spec (one encoded field), 5 trace id
ENQUEUE = (
    _PREFIX
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local now = now_ms()
if ADMISSION then
  -- the tenant's backlog share (admission): counted, bounded
  if redis.call('ZCARD', KEYS[6]) >= 100000 then return -1 end
  redis.call('ZADD', KEYS[6], now, ARGV[1])
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'tenant', ARGV[3], 'status', 'queued',
  'created_at_ms', now, 'metadata', '{}', 'trace_id', ARGV[5], 'spec', ARGV[4])
if redis.call('RPUSH', KEYS[3], ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[4], ARGV[3])
  if DRR then redis.call('HSET', KEYS[7], 'w:' .. ARGV[3], 1, 'c:' .. ARGV[3], 0) end
end
redis.call('ZADD', KEYS[5], now, ARGV[1])
emit(KEYS[2], KEYS[1], {ARGV[1], ARGV[3], '{}', ARGV[5]}, ARGV[2], 'queued',
  '"quality":"preview","stream":"interactive"', now)
return 1
"""
)

# KEYS: 1 ring, 2 stream, 3 outbox; ARGV: 1 group, 2 consumer, 3 count, 4 lease ms,
# 5 token prefix, 6.. event ids (one per job started)
TAKE_START = (
    _PREFIX
    + f"""
local n = tonumber(ARGV[3])
if MEMO then
  -- a resend is answered from the call's memo (written below)
  local prior = redis.call('GET', KEYS[5])
  if prior then return cjson.decode(prior) end
end
local state = {{}}
for i = 1, n do
  local tenant = redis.call('LMOVE', KEYS[1], KEYS[1], 'LEFT', 'RIGHT')
  if not tenant then break end
  if DRR and not state[tenant] then
    -- deficit, running count, weight, cap: read once per tenant per feed
    state[tenant] = redis.call('HMGET', KEYS[4], 'd:' .. tenant, 'r:' .. tenant,
      'w:' .. tenant, 'c:' .. tenant)
  end
  local job_id = redis.call('LPOP', '{TAG}:fq:' .. tenant)
  if not job_id then
    redis.call('LREM', KEYS[1], 1, tenant)
  else
    redis.call('XADD', KEYS[2], '*', 'job', job_id)
  end
end
if DRR then
  local sets = {{}}
  for t, _ in pairs(state) do
    sets[#sets + 1] = 'd:' .. t
    sets[#sets + 1] = 1
  end
  if #sets > 0 then redis.call('HSET', KEYS[4], unpack(sets)) end
end
local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n, 'STREAMS',
  KEYS[2], '>')
local out = {{}}
if not read then return out end
local now = now_ms()
for i, e in ipairs(read[1][2]) do
  local job_id = e[2][2]
  local job_key = '{TAG}:job:' .. job_id
  local f = redis.call('HMGET', job_key, 'id', 'tenant', 'metadata', 'trace_id', 'status')
  if f[5] == 'queued' then
    local token = ARGV[5] .. i
    if LEASE then redis.call('SET', '{TAG}:lease:' .. job_id, token, 'PX', ARGV[4]) end
    if CAPS then redis.call('HINCRBY', KEYS[4], 'r:' .. f[2], 1) end
    redis.call('HSET', job_key, 'status', 'processing', 'lease_token', token,
      'lease_until_ms', now + tonumber(ARGV[4]), 'started_at_ms', now, 'entry_id', e[1])
    emit(KEYS[3], job_key, f, ARGV[5 + i], 'started', '"attempt":1', now)
    out[#out + 1] = e[1]
    out[#out + 1] = job_id
    out[#out + 1] = token
  end
end
if MEMO and #out > 0 then redis.call('SET', KEYS[5], cjson.encode(out), 'PX', 60000) end
return out
"""
)

# KEYS: 1 stream, 2 outbox; ARGV: 1 group, then per job: entry id, job id, token, event id
FINISH = (
    _PREFIX
    + f"""
local out = {{}}
local now = now_ms()
for i = 2, #ARGV, 4 do
  local entry_id, job_id, token, event_id = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local job_key = '{TAG}:job:' .. job_id
  local f = redis.call('HMGET', job_key, 'id', 'tenant', 'metadata', 'trace_id',
    'lease_token', 'last_commit')
  if f[6] == token then
    out[#out + 1] = 'ok'  -- a resend: answered as the first time
  elseif f[5] ~= token then
    out[#out + 1] = 'lease_lost'
  else
    redis.call('HSET', job_key, 'status', 'completed', 'completed_at_ms', now,
      'lease_token', '', 'last_commit', token)
    if LEASE then redis.call('DEL', '{TAG}:lease:' .. job_id) end
    if ADMISSION then redis.call('ZREM', '{TAG}:backlog:' .. f[2], job_id) end
    if CAPS then redis.call('HINCRBY', '{TAG}:fq:state', 'r:' .. f[2], -1) end
    redis.call('XACK', KEYS[1], ARGV[1], entry_id)
    redis.call('XDEL', KEYS[1], entry_id)
    emit(KEYS[2], job_key, f, event_id, 'completed', '"model":"noop","compute_time_ms":0', now)
    redis.call('PEXPIRE', job_key, {RETENTION_MS})
    out[#out + 1] = 'ok'
  end
end
return out
"""
)


def _variant_name(extras: frozenset[str]) -> str:
    if not extras:
        return "lean floor: the guarantees' commands"
    if extras == frozenset(EXTRAS):
        return "lean floor + all of: " + ", ".join(EXTRAS)
    return "lean floor + " + ", ".join(sorted(extras))


def _key(*parts: str) -> str:
    return ":".join((TAG, *parts))


async def _cpu_s(redis: Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def floor_round(
    redis: Redis, n_jobs: int, batch: int, extras: frozenset[str]
) -> tuple[float, float, float]:
    """(enqueue, drain) Redis CPU µs per job, and jobs/s of the drain, for one round of the
    lean scripts with `extras` (of EXTRAS) on."""
    await redis.flushall()
    head = "".join(f"local {x.upper()} = {str(x in extras).lower()}\n" for x in EXTRAS)
    shas = [await redis.script_load(head + s) for s in (ENQUEUE, TAKE_START, FINISH)]
    stream, outbox, ring, state = _key("stream"), _key("events"), _key("ring"), _key("fq:state")
    await redis.xgroup_create(stream, "g", id="0", mkstream=True)
    cpu0 = await _cpu_s(redis)
    left = n_jobs

    async def producer(p: int) -> None:
        # One call per job, as a gateway's request makes: no pipelining across jobs.
        nonlocal left
        while left > 0:
            left -= 1
            i = left
            tenant = f"t{i % TENANTS}"
            job_id = f"job_{p}_{i:08d}"
            await redis.evalsha(  # type: ignore[misc]
                shas[0], 7, _key("job", job_id), outbox, _key("fq", tenant), ring,
                _key("jobs", tenant), _key("backlog", tenant), state, job_id, f"evt_q{i}", tenant,
                '{"quality":"preview","params":{},"input_ref":"inputs/x.png","model":"m"}',
                f"trace{i:024d}",
            )  # fmt: skip

    await asyncio.gather(*(producer(p) for p in range(64)))
    cpu1 = await _cpu_s(redis)
    done, t0, k = 0, time.perf_counter(), 0
    while done < n_jobs:
        k += 1
        events = [f"evt_s{k}_{i}" for i in range(batch)]
        started = await redis.evalsha(  # type: ignore[misc]
            shas[1],
            5,
            ring,
            stream,
            outbox,
            state,
            _key("memo", str(k)),
            "g",
            "c1",
            batch,
            30_000,
            f"tok{k}_",
            *events,
        )
        if not started:
            continue
        args: list[str] = ["g"]
        for j in range(0, len(started), 3):
            args += [started[j], started[j + 1], started[j + 2], f"evt_c{k}_{j}"]
        replies = await redis.evalsha(shas[2], 2, stream, outbox, *args)  # type: ignore[misc]
        assert all(r == "ok" for r in replies), replies
        done += len(replies)
    elapsed = time.perf_counter() - t0
    cpu2 = await _cpu_s(redis)
    return (cpu1 - cpu0) * 1e6 / n_jobs, (cpu2 - cpu1) * 1e6 / n_jobs, n_jobs / elapsed


async def run(n_jobs: int, batch: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp), appendonly=False)
        await server.start()
        redis = Redis.from_url(server.url, decode_responses=True)
        rows: dict[str, list[tuple[float, float]]] = {}
        try:
            for r in range(rounds):
                variants = [frozenset(), *(frozenset([x]) for x in EXTRAS), frozenset(EXTRAS)]
                for extras in variants:
                    enq, drain, rate = await floor_round(redis, n_jobs, batch, extras)
                    name = _variant_name(extras)
                    rows.setdefault(name, []).append((enq, drain))
                    print(f"round {r + 1}: {name}: enqueue {enq:.1f} drain {drain:.1f} µs/job "
                          f"({rate:,.0f} jobs/s drained by one loop)")  # fmt: skip
                await redis.flushall()
                for peer in (splatq_noop, taskiq_noop):
                    m = await harness.check(peer, server.url, n_jobs, batch, verbose=False)
                    name = m.name if m.name.startswith("taskiq") else f"{m.name} (today)"
                    rows.setdefault(name, []).append(
                        (m.enqueue_cpu_us_per_job, m.drain_cpu_us_per_job)
                    )
                    print(f"round {r + 1}: {m.name} enqueue {m.enqueue_cpu_us_per_job:.1f} "
                          f"drain {m.drain_cpu_us_per_job:.1f} µs/job")  # fmt: skip
        finally:
            await redis.aclose()
            await server.stop()
    taskiq = next(v for k, v in rows.items() if k.startswith("taskiq"))
    base = statistics.median(e + d for e, d in taskiq)
    print(f"\n{n_jobs} no-op jobs, batches of {batch}, {rounds} rounds; Redis CPU (INFO cpu)\n")
    print("| system | enqueue µs/job | drain µs/job | total µs/job | x taskiq |")
    print("|---|---:|---:|---:|---:|")
    for name, values in rows.items():
        e = statistics.median(v[0] for v in values)
        d = statistics.median(v[1] for v in values)
        t = statistics.median(v[0] + v[1] for v in values)
        print(f"| {name} | {e:.1f} | {d:.1f} | {t:.1f} | {t / base:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--batch", type=int, default=10, help="jobs per take/commit (concurrency)")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    asyncio.run(run(a.jobs, a.batch, a.rounds))


if __name__ == "__main__":
    main()
