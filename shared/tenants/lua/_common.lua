-- Helpers prepended to each quota script by shared/tenants/scripts.py. They touch only keys
-- derived from a declared key's own hash tag (same slot), like the engine's `<job>:events`.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- 'splatq:{tenant:acme}:reservations' -> 'splatq:{tenant:acme}'
local function key_tag(key)
  return string.sub(key, 1, (string.find(key, '}', 1, true)))
end

-- `period_id|amount_ms|at_ms` -> period_id, amount_ms
local function parse_reservation(value)
  local a = string.find(value, '|', 1, true)
  local b = string.find(value, '|', a + 1, true)
  return string.sub(value, 1, a - 1), tonumber(string.sub(value, a + 1, b - 1))
end

-- Take `amount` out of a usage hash's reserved_ms, never below zero.
local function unreserve(usage, amount)
  local left = redis.call('HINCRBY', usage, 'reserved_ms', -amount)
  if left < 0 then redis.call('HSET', usage, 'reserved_ms', 0) end
end

local function keep_for(key, ttl_ms)
  if redis.call('PTTL', key) < 0 then redis.call('PEXPIRE', key, ttl_ms) end
end
