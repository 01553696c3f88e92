-- wh_ep_update: change an endpoint's url, event types or enabled state. Enabling clears the
-- disabled mark and the health record (a fresh start: circuit closed, no failure streak).
-- KEYS (one slot {wh:<tenant>}): 1 endpoint index, 2 endpoint hash
-- ARGV: 1 endpoint id, 2 url ('' unchanged), 3 '1' if 4 holds new event types, 4 event types,
--       5 enabled: '1' enable, '0' disable, '' unchanged, 6 '1' if 7 holds new custom
--       headers (optional), 7 custom headers JSON ('' = none)
-- Returns 'updated' | 'missing'
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 'missing'
end
local now = now_ms()
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[2], 'url', ARGV[2])
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[2], 'events', ARGV[4])
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
end
if ARGV[6] == '1' then
  if ARGV[7] == '' then
    redis.call('HDEL', KEYS[2], 'headers')
  else
    redis.call('HSET', KEYS[2], 'headers', ARGV[7])
  end
end
if ARGV[5] == '1' then
  redis.call('HDEL', KEYS[2], 'disabled_at_ms', 'disabled_reason', 'failing_since_ms',
    'open_until_ms', 'probe_until_ms')
  redis.call('HSET', KEYS[2], 'circuit', 'closed', 'consecutive_failures', 0,
    'window_start_ms', now, 'window_attempts', 0, 'window_failures', 0, 'opened_count', 0)
elseif ARGV[5] == '0' and not redis.call('HGET', KEYS[2], 'disabled_at_ms') then
  redis.call('HSET', KEYS[2], 'disabled_at_ms', now, 'disabled_reason', 'disabled through the API')
end
return 'updated'
