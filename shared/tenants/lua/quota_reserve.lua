-- reserve: saga step 1. Holds the job's estimated GPU time against the tenant's quota of
-- the current period, or refuses. Done at most once per job (a resend answers 'exists').
-- KEYS (one slot, the tenant's): 1 quota, 2 reservations, 3 saga ledger of the job,
--       4 usage of the current day, 5 usage of the current month
-- ARGV: 1 job_id, 2 amount_ms, 3 day id, 4 month id, 5 day reset ms, 6 month reset ms,
--       7 saga ttl ms, 8 usage ttl ms (after the period's reset)
-- Returns {'reserved'|'exists'|'exceeded', limit_ms (-1 = none), reserved_ms, used_ms,
--          reset_ms, period_id}
local q = redis.call('HMGET', KEYS[1], 'gpu_ms', 'period')
local day = q[2] == 'day'
local usage = day and KEYS[4] or KEYS[5]
local pid = day and ARGV[3] or ARGV[4]
local reset = tonumber(day and ARGV[5] or ARGV[6])
local limit = tonumber(q[1])
local u = redis.call('HMGET', usage, 'reserved_ms', 'used_ms')
local reserved, used = tonumber(u[1]) or 0, tonumber(u[2]) or 0
-- Integers as digits: tostring() writes a number past 1e14 (a quota the admin API accepts,
-- up to 1e12 GPU-seconds = 1e15 ms) as "8.6e+14", which no integer parser reads.
local function int(n) return string.format('%.0f', n) end
local function answer(outcome)
  return {outcome, int(limit or -1), int(reserved), int(used), int(reset), pid}
end
if redis.call('HEXISTS', KEYS[3], 'reserve') == 1 then return answer('exists') end
local amount = tonumber(ARGV[2])
if limit and reserved + used + amount > limit then return answer('exceeded') end
local now = now_ms()
reserved = redis.call('HINCRBY', usage, 'reserved_ms', amount)
redis.call('PEXPIREAT', usage, reset + tonumber(ARGV[8]))
redis.call('HSET', KEYS[2], ARGV[1], pid .. '|' .. amount .. '|' .. now)
redis.call('HSET', KEYS[3], 'reserve', now .. '|' .. amount .. '|' .. pid)
redis.call('PEXPIRE', KEYS[3], ARGV[7])
return answer('reserved')
