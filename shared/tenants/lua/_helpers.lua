-- The tenants' own Lua helpers, included per script by the engine's runner
-- (shared/engine/scripts.py) with the engine's (`now_ms`, `key_tag`...): each script gets
-- the ones it names. They touch only keys derived from a declared key's own hash tag (same
-- slot).

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
