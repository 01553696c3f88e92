-- report: what the vendor said to one call, for the whole lane. `success` (it answered,
-- even with a 4xx: it is up) closes the circuit; `failure` (a timeout, a reset, a 5xx)
-- counts towards opening it, and a failed probe opens it again for twice as long (capped);
-- `slow_down` (429/503 with Retry-After) pauses the lane until then -- every process's next
-- permit waits -- and moves the rate's arrival time past the pause, so no burst follows it.
-- KEYS (one slot): 1 breaker, 2 pause, 3 rate, 4 this report's marker
-- ARGV: 1 outcome success|failure|slow_down, 2 member, 3 failure threshold, 4 open ms,
--   5 open cap ms, 6 pause until ms (slow_down), 7 marker ttl ms
-- Returns {state, open_until ms, failures, opened '1'|'0'}.
-- Safe to resend: the marker makes a second delivery of one report count nothing.
local b = redis.call('HMGET', KEYS[1], 'state', 'failures', 'open_until', 'open_ms', 'probe')
local state, failures = b[1] or 'closed', tonumber(b[2]) or 0
local open_until = tonumber(b[3]) or 0
local function answer(opened)
  return {state, open_until, failures, opened}
end
if redis.call('SET', KEYS[4], '1', 'NX', 'PX', tonumber(ARGV[7])) == false then
  return answer('0')
end
local now = now_ms()
local outcome, member = ARGV[1], ARGV[2]
local is_probe = b[5] == member
if outcome == 'success' then
  if state ~= 'closed' or failures > 0 then
    state, failures, open_until = 'closed', 0, 0
    redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', 0, 'open_until', 0, 'open_ms', 0)
    redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
  end
  return answer('0')
end
if outcome == 'failure' then
  if state == 'open' then
    if not is_probe then return answer('0') end
    local period = math.min(math.max(tonumber(b[4]) or 0, tonumber(ARGV[4])) * 2,
      tonumber(ARGV[5]))
    open_until = now + period
    redis.call('HSET', KEYS[1], 'open_until', open_until, 'open_ms', period)
    redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
    redis.call('HINCRBY', KEYS[1], 'opened', 1)
    return answer('1')
  end
  failures = failures + 1
  if failures >= tonumber(ARGV[3]) then
    state, open_until = 'open', now + tonumber(ARGV[4])
    redis.call('HSET', KEYS[1], 'state', 'open', 'failures', failures, 'open_until', open_until,
      'open_ms', tonumber(ARGV[4]))
    redis.call('HINCRBY', KEYS[1], 'opened', 1)
    return answer('1')
  end
  redis.call('HSET', KEYS[1], 'failures', failures)
  return answer('0')
end
-- slow_down
local pause_until = tonumber(ARGV[6])
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if pause_until > current and pause_until > now then
  redis.call('SET', KEYS[2], pause_until, 'PX', pause_until - now)
end
local tat = tonumber(redis.call('GET', KEYS[3]) or '0')
if pause_until > tat and pause_until > now then
  redis.call('SET', KEYS[3], string.format('%.3f', pause_until), 'PX', pause_until - now + 1000)
end
if is_probe then redis.call('HDEL', KEYS[1], 'probe', 'probe_until') end
return answer('0')
