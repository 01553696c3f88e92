-- wh_result: record one delivery attempt and decide the message's next state: delivered,
-- retry at a later time (durable: it is a score in the due set), or failed (dead-lettered
-- with its attempt count; a permanent answer, or the last attempt).
-- KEYS (one slot): 1 due zset, 2 message hash, 3 job delivery log, 4 webhook dead letters
-- ARGV: 1 message id, 2 outcome 'delivered'|'retry'|'failed', 3 delay ms (retry),
--       4 attempt record JSON, 5 log cap, 6 dead-letter maxlen, 7 retention ms, 8 reason
-- Returns the message's new status
local now = now_ms()
redis.call('LPUSH', KEYS[3], ARGV[4])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[5]) - 1)
redis.call('PEXPIRE', KEYS[3], ARGV[7])
local outcome = ARGV[2]
if outcome == 'retry' then
  local at = now + tonumber(ARGV[3])
  redis.call('HSET', KEYS[2], 'status', 'pending', 'next_at_ms', at, 'last_error', ARGV[8])
  redis.call('ZADD', KEYS[1], at, ARGV[1])
  return 'pending'
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
if outcome == 'delivered' then
  redis.call('HSET', KEYS[2], 'status', 'delivered', 'delivered_at_ms', now)
  return 'delivered'
end
redis.call('HSET', KEYS[2], 'status', 'failed', 'failed_at_ms', now, 'last_error', ARGV[8])
local m = redis.call('HMGET', KEYS[2], 'event_id', 'job_id', 'tenant', 'url', 'attempts')
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'message', ARGV[1],
  'event_id', m[1] or '', 'job', m[2] or '', 'tenant', m[3] or '', 'url', m[4] or '',
  'attempts', m[5] or '0', 'reason', ARGV[8], 'at_ms', now)
return 'failed'
