-- acquire: one permit to create a prediction at a vendor, for the whole fleet: a leased
-- concurrency slot and a token of the vendor's creation rate (GCRA), and the same of the
-- member's tenant when the vendor has per-tenant limits. All or nothing: a rate token is
-- taken only with a slot. Waiters are served in the order of their tickets (the job's age),
-- whichever process they run in: a waiter may take a permit only while fewer waiters are
-- ahead of it than slots are free. A waiter that stops asking (its process died) is dropped
-- from the head of the line after `stale ms`; a slot whose holder stops renewing it lapses.
-- A paused lane (the vendor said 429/503 + Retry-After) and an open circuit grant nothing;
-- once the circuit's open period is over, one waiter at a time is granted as its probe.
-- KEYS (one slot, `{vendor:<name>}`): 1 slots, 2 tenant slots, 3 holders, 4 rate,
--   5 tenant rate, 6 waiting, 7 seen, 8 pause, 9 breaker
-- ARGV: 1 member, 2 permit id, 3 ticket, 4 concurrency, 5 tenant concurrency (0 = none),
--   6 interval ms, 7 tau ms, 8 tenant interval ms (0 = none), 9 tenant tau ms,
--   10 slot ttl ms, 11 waiter stale ms, 12 slot poll ms
-- Returns {'ok', 'new'|'held'|'probe'} | {'wait', retry ms, reason} | {'paused', until ms}
--   | {'open', until ms}
-- Safe to resend: a grant records its permit id (holders), and a resend of the same permit
-- answers 'held' without taking a second token.
local member, permit = ARGV[1], ARGV[2]
local now = now_ms()
local ttl = tonumber(ARGV[10])
if redis.call('HGET', KEYS[3], member) == permit then
  if redis.call('ZSCORE', KEYS[1], member) then
    redis.call('ZADD', KEYS[1], now + ttl, member)
    return {'ok', 'held'}
  end
end
local paused = tonumber(redis.call('GET', KEYS[8]) or '0')
if paused > now then
  redis.call('HSET', KEYS[7], member, now)  -- keeps its place in line meanwhile
  return {'paused', paused}
end
local b = redis.call('HMGET', KEYS[9], 'state', 'open_until', 'probe', 'probe_until')
local probe = false
if b[1] == 'open' then
  local open_until = tonumber(b[2]) or 0
  if now < open_until then
    redis.call('HSET', KEYS[7], member, now)
    return {'open', open_until}
  end
  local probe_until = tonumber(b[4]) or 0
  if b[3] and b[3] ~= member and probe_until > now then
    redis.call('HSET', KEYS[7], member, now)
    return {'open', math.min(probe_until, now + tonumber(ARGV[12]) * 10)}
  end
  probe = true  -- half-open: this one call tries the vendor
end
local tconc, tinterval = tonumber(ARGV[5]), tonumber(ARGV[8])
expire_slots(KEYS[1], KEYS[3], now)
if tconc > 0 then
  expire_slots(KEYS[2], nil, now)
  if redis.call('ZCARD', KEYS[2]) >= tconc then
    leave_line(KEYS[6], KEYS[7], member)  -- held back by its own tenant: blocks nobody
    return {'wait', tonumber(ARGV[12]), 'tenant_slots'}
  end
end
local ttat = 0
if tinterval > 0 then
  ttat = tonumber(redis.call('GET', KEYS[5]) or '0')
  local early = ttat - tonumber(ARGV[9]) - now
  if early > 0 then
    leave_line(KEYS[6], KEYS[7], member)
    return {'wait', math.max(1, math.ceil(early)), 'tenant_rate'}
  end
end
redis.call('ZADD', KEYS[6], 'NX', tonumber(ARGV[3]), member)
redis.call('HSET', KEYS[7], member, now)
-- the head of the line: drop waiters that stopped asking (their process died)
local stale_before = now - tonumber(ARGV[11])
for _ = 1, 16 do
  local head = redis.call('ZRANGE', KEYS[6], 0, 0)[1]
  if not head or head == member then break end
  if (tonumber(redis.call('HGET', KEYS[7], head)) or 0) >= stale_before then break end
  leave_line(KEYS[6], KEYS[7], head)
end
local rank = redis.call('ZRANK', KEYS[6], member)
local interval = tonumber(ARGV[6])
local free = tonumber(ARGV[4]) - redis.call('ZCARD', KEYS[1])
if rank >= free then
  local behind = rank - math.max(free, 0) + 1
  return {'wait', math.min(tonumber(ARGV[12]) * behind, 1000), 'slots'}
end
local tat = tonumber(redis.call('GET', KEYS[4]) or '0')
local early = tat - tonumber(ARGV[7]) - now
if early > 0 then
  return {'wait', early + rank * interval, 'rate'}
end
leave_line(KEYS[6], KEYS[7], member)
redis.call('ZADD', KEYS[1], now + ttl, member)
redis.call('HSET', KEYS[3], member, permit)
local next_tat = math.max(tat, now) + interval
-- '%.3f': a plain tostring keeps 14 digits, too few for ms since 1970 with a fraction
redis.call('SET', KEYS[4], string.format('%.3f', next_tat), 'PX',
  math.ceil(next_tat - now + interval))
if tconc > 0 then redis.call('ZADD', KEYS[2], now + ttl, member) end
if tinterval > 0 then
  local t_next = math.max(ttat, now) + tinterval
  redis.call('SET', KEYS[5], string.format('%.3f', t_next), 'PX',
    math.ceil(t_next - now + tinterval))
end
if probe then
  redis.call('HSET', KEYS[9], 'probe', member, 'probe_until', now + ttl)
  return {'ok', 'probe'}
end
return {'ok', 'new'}
