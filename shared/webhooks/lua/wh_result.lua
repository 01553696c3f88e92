-- wh_result: record one delivery attempt and decide the message's next state: delivered,
-- retry at a later time (durable: it is a score in the due set), deferred (not attempted:
-- the endpoint's circuit is open; the attempt is given back), dropped (its endpoint was
-- deleted) or failed (dead-lettered with its attempt count and its attempt log: a permanent
-- answer, the last attempt, or a disabled endpoint). A dead letter is also indexed under its
-- (tenant, target), so that `recover` reads only its endpoint's entries.
-- KEYS (one slot): 1 due zset, 2 message hash, 3 job delivery log, 4 webhook dead letters,
--       5 the message's (tenant, target) dead-letter index
-- ARGV: 1 message id, 2 outcome 'delivered'|'retry'|'deferred'|'dropped'|'failed',
--       3 delay ms (retry, deferred), 4 attempt record JSON ('' = not logged), 5 log cap,
--       6 dead-letter maxlen, 7 retention ms, 8 reason code, 9 reason detail,
--       10 '0' when the message belongs to no job (a test event: KEYS[3] is then unused)
-- Returns the message's new status
-- Not registered as a script of its own: wh_result_batch.lua runs it once per message
-- (`--@include wh_result as result_one`), with these KEYS and ARGV built per message.
local MESSAGE_LOG_CAP = 20
local now = now_ms()
local outcome = ARGV[2]
if redis.call('HGET', KEYS[2], 'status') ~= 'pending' then
  -- Recorded already (a duplicate result after a visibility timeout): first one wins.
  return redis.call('HGET', KEYS[2], 'status') or 'missing'
end
if ARGV[4] ~= '' then
  if ARGV[10] ~= '0' then
    redis.call('LPUSH', KEYS[3], ARGV[4])
    redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[5]) - 1)
    redis.call('PEXPIRE', KEYS[3], ARGV[7])
  end
  -- The message's own attempt log (newest MESSAGE_LOG_CAP lines of JSON), which goes with
  -- it to the dead letters.
  local log = (redis.call('HGET', KEYS[2], 'log') or '') .. ARGV[4] .. '\n'
  local lines = select(2, string.gsub(log, '\n', ''))
  while lines > MESSAGE_LOG_CAP do
    log = string.sub(log, string.find(log, '\n', 1, true) + 1)
    lines = lines - 1
  end
  redis.call('HSET', KEYS[2], 'log', log)
end
if outcome == 'retry' or outcome == 'deferred' then
  local at = now + tonumber(ARGV[3])
  if outcome == 'deferred' then
    redis.call('HINCRBY', KEYS[2], 'attempts', -1)
    redis.call('HSET', KEYS[2], 'next_at_ms', at, 'deferred_by', ARGV[8])
  else
    redis.call('HSET', KEYS[2], 'next_at_ms', at, 'last_error', ARGV[9])
  end
  redis.call('ZADD', KEYS[1], at, ARGV[1])
  return 'pending'
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
if outcome == 'delivered' then
  redis.call('HSET', KEYS[2], 'status', 'delivered', 'delivered_at_ms', now)
  return 'delivered'
end
if outcome == 'dropped' then
  redis.call('HSET', KEYS[2], 'status', 'dropped', 'last_error', ARGV[9])
  return 'dropped'
end
redis.call('HSET', KEYS[2], 'status', 'failed', 'failed_at_ms', now, 'last_error', ARGV[9])
local m = redis.call('HMGET', KEYS[2], 'event_id', 'job_id', 'tenant', 'url', 'attempts',
  'target', 'event_type', 'log')
local entry_id = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'message', ARGV[1],
  'event_id', m[1] or '', 'event', m[7] or '', 'job', m[2] or '', 'tenant', m[3] or '',
  'target', m[6] or '', 'url', m[4] or '', 'attempts', m[5] or '0', 'reason', ARGV[8],
  'detail', ARGV[9], 'at_ms', now, 'attempt_log', m[8] or '')
-- Scored by the entry id's time, which `recover {since}` compares with. Members whose entry
-- was trimmed (MAXLEN) are dropped by wh_redrive when met; the cap and the TTL (twice the
-- messages' retention: older ones still count as expired for a while) bound the rest.
redis.call('ZADD', KEYS[5], tonumber(string.match(entry_id, '^%d+')), entry_id .. ' ' .. ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[5], 0, -tonumber(ARGV[6]) - 1)
redis.call('PEXPIRE', KEYS[5], 2 * tonumber(ARGV[7]))
return 'failed'
