-- wh_ep_health: fold one attempt's result into the endpoint's health. Success closes the
-- circuit and ends a failure streak. A failure counts towards the breaker (N consecutive,
-- or a failure ratio over a window with enough attempts): it opens, for a cool-down that
-- doubles with each consecutive opening (capped); a failed half-open probe re-opens it.
-- Failing continuously for longer than the disable period, or a 410, disables the endpoint.
-- KEYS (one slot {wh:<tenant>}): 1 endpoint hash
-- ARGV: 1 'ok'|'fail'|'gone', 2 consecutive threshold, 3 failure ratio, 4 minimum attempts,
--       5 window ms, 6 open ms, 7 open cap ms, 8 disable after ms, 9 disable reason (gone)
-- Returns {circuit state or 'disabled' or 'missing', open until ms or 0}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'missing', 0}
end
local outcome = ARGV[1]
if outcome == 'gone' then
  if not redis.call('HGET', KEYS[1], 'disabled_at_ms') then
    redis.call('HSET', KEYS[1], 'disabled_at_ms', now, 'disabled_reason', ARGV[9],
      'last_failure_ms', now)
  end
  return {'disabled', 0}
end
local f = redis.call('HMGET', KEYS[1], 'circuit', 'window_start_ms', 'window_attempts',
  'window_failures', 'consecutive_failures', 'failing_since_ms', 'opened_count',
  'disabled_at_ms', 'open_until_ms')
local circuit = f[1] or 'closed'
local window_start = tonumber(f[2] or '0')
local attempts = tonumber(f[3] or '0')
local failures = tonumber(f[4] or '0')
if now - window_start > tonumber(ARGV[5]) then
  window_start, attempts, failures = now, 0, 0
end
attempts = attempts + 1
if outcome == 'ok' then
  redis.call('HSET', KEYS[1], 'circuit', 'closed', 'consecutive_failures', 0, 'opened_count', 0,
    'last_success_ms', now, 'window_start_ms', window_start, 'window_attempts', attempts,
    'window_failures', failures)
  redis.call('HDEL', KEYS[1], 'failing_since_ms', 'open_until_ms', 'probe_until_ms')
  return {'closed', 0}
end
failures = failures + 1
local consecutive = tonumber(f[5] or '0') + 1
local failing_since = tonumber(f[6] or tostring(now))
redis.call('HSET', KEYS[1], 'consecutive_failures', consecutive, 'failing_since_ms',
  failing_since, 'last_failure_ms', now, 'window_start_ms', window_start, 'window_attempts',
  attempts, 'window_failures', failures)
if f[8] then
  return {'disabled', 0}
end
if now - failing_since >= tonumber(ARGV[8]) then
  redis.call('HSET', KEYS[1], 'disabled_at_ms', now, 'disabled_reason',
    'failing continuously for longer than the disable period')
  return {'disabled', 0}
end
local trips = consecutive >= tonumber(ARGV[2])
  or (attempts >= tonumber(ARGV[4]) and failures / attempts >= tonumber(ARGV[3]))
if circuit == 'half_open' or (circuit == 'closed' and trips) then
  local opened = tonumber(f[7] or '0')
  local cool = math.min(tonumber(ARGV[7]), tonumber(ARGV[6]) * (2 ^ opened))
  local open_until = now + math.floor(cool)
  redis.call('HSET', KEYS[1], 'circuit', 'open', 'open_until_ms', open_until,
    'opened_count', opened + 1)
  redis.call('HDEL', KEYS[1], 'probe_until_ms')
  return {'open', open_until}
end
return {circuit, tonumber(f[9] or '0')}
