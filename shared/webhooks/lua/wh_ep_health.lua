-- wh_ep_health: fold attempts' results, in order, into the endpoint's health. Success
-- closes the circuit and ends a failure streak. A failure counts towards the breaker (N
-- consecutive, or a failure ratio over a window with enough attempts): it opens, for a
-- cool-down that doubles with each consecutive opening (capped); a failed half-open probe
-- re-opens it. Failing continuously for longer than the disable period, or a 410, disables
-- the endpoint. One call folds every result of a recorder batch for this endpoint.
-- KEYS (one slot {wh:<tenant>}): 1 endpoint hash
-- ARGV: 1 outcomes, comma-separated, oldest first: 'ok' | 'fail' | 'gone',
--       2 consecutive threshold, 3 failure ratio, 4 minimum attempts, 5 window ms,
--       6 open ms, 7 open cap ms, 8 disable after ms, 9 disable reason (gone)
-- Returns {circuit state or 'disabled' or 'missing', open until ms or 0}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'missing', 0}
end
local f = redis.call('HMGET', KEYS[1], 'circuit', 'window_start_ms', 'window_attempts',
  'window_failures', 'consecutive_failures', 'failing_since_ms', 'opened_count',
  'disabled_at_ms', 'open_until_ms')
local h = {
  circuit = f[1] or 'closed',
  window_start = tonumber(f[2] or '0'),
  attempts = tonumber(f[3] or '0'),
  failures = tonumber(f[4] or '0'),
  consecutive = tonumber(f[5] or '0'),
  failing_since = tonumber(f[6] or '0'),
  opened = tonumber(f[7] or '0'),
  disabled = f[8] ~= false and f[8] ~= nil,
  open_until = tonumber(f[9] or '0'),
  last_success = false,
  last_failure = false,
  disabled_reason = false,
}
for outcome in string.gmatch(ARGV[1], '[^,]+') do
  if outcome == 'gone' then
    h.last_failure = true
    if not h.disabled then
      h.disabled = true
      h.disabled_reason = ARGV[9]
    end
  else
    if now - h.window_start > tonumber(ARGV[5]) then
      h.window_start, h.attempts, h.failures = now, 0, 0
    end
    h.attempts = h.attempts + 1
    if outcome == 'ok' then
      h.circuit, h.consecutive, h.opened, h.failing_since, h.open_until = 'closed', 0, 0, 0, 0
      h.last_success = true
    else
      h.failures = h.failures + 1
      h.consecutive = h.consecutive + 1
      if h.failing_since == 0 then h.failing_since = now end
      h.last_failure = true
      if not h.disabled and now - h.failing_since >= tonumber(ARGV[8]) then
        h.disabled = true
        h.disabled_reason = 'failing continuously for longer than the disable period'
      end
      local trips = h.consecutive >= tonumber(ARGV[2])
        or (h.attempts >= tonumber(ARGV[4]) and h.failures / h.attempts >= tonumber(ARGV[3]))
      if h.circuit == 'half_open' or (h.circuit == 'closed' and trips) then
        local cool = math.min(tonumber(ARGV[7]), tonumber(ARGV[6]) * (2 ^ h.opened))
        h.circuit, h.open_until, h.opened = 'open', now + math.floor(cool), h.opened + 1
      end
    end
  end
end
redis.call('HSET', KEYS[1], 'circuit', h.circuit, 'consecutive_failures', h.consecutive,
  'opened_count', h.opened, 'window_start_ms', h.window_start, 'window_attempts', h.attempts,
  'window_failures', h.failures)
if h.failing_since > 0 then
  redis.call('HSET', KEYS[1], 'failing_since_ms', h.failing_since)
else
  redis.call('HDEL', KEYS[1], 'failing_since_ms')
end
if h.circuit == 'open' then
  redis.call('HSET', KEYS[1], 'open_until_ms', h.open_until)
  redis.call('HDEL', KEYS[1], 'probe_until_ms')
elseif h.circuit == 'closed' then
  redis.call('HDEL', KEYS[1], 'open_until_ms', 'probe_until_ms')
end
if h.last_success then redis.call('HSET', KEYS[1], 'last_success_ms', now) end
if h.last_failure then redis.call('HSET', KEYS[1], 'last_failure_ms', now) end
if h.disabled_reason then
  redis.call('HSET', KEYS[1], 'disabled_at_ms', now, 'disabled_reason', h.disabled_reason)
end
if h.disabled then
  return {'disabled', 0}
end
return {h.circuit, h.open_until}
