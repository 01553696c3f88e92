-- Helpers prepended to each vendor-lane script by shared/vendor/scripts.py (only those it
-- names). They touch only keys passed to them, so each script's one slot is its KEYS'.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Drop the slots whose lease lapsed (a killed worker's), with their permit records.
local function expire_slots(slots, holders, now)
  local gone = redis.call('ZRANGEBYSCORE', slots, '-inf', now)
  if #gone > 0 then
    redis.call('ZREM', slots, unpack(gone))
    if holders then redis.call('HDEL', holders, unpack(gone)) end
  end
end

-- Leave the waiting line (granted, given up, or held back by its own tenant's limit).
local function leave_line(waiting, seen, member)
  redis.call('ZREM', waiting, member)
  redis.call('HDEL', seen, member)
end
