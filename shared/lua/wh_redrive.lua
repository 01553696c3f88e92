-- wh_redrive: send dead-lettered messages again (`recover`, `splatq dlq redrive --kind
-- webhooks`): each failed message becomes pending with a fresh attempt budget, due now, and
-- leaves the dead-letter stream. A message whose hash has expired cannot be sent again (its
-- payload is gone); its entry stays for the operator to purge.
-- KEYS (one slot): 1 due zset, 2 webhook dead letters, 3.. message hashes
-- ARGV: per message hash, its dead-letter entry id then its message id
-- Returns {redriven, expired, skipped (already pending or delivered: entry removed)}
local now = now_ms()
local redriven, expired, skipped = 0, 0, 0
for i = 3, #KEYS do
  local entry_id = ARGV[(i - 3) * 2 + 1]
  local msg_id = ARGV[(i - 3) * 2 + 2]
  local status = redis.call('HGET', KEYS[i], 'status')
  if status == 'failed' then
    redis.call('HSET', KEYS[i], 'status', 'pending', 'attempts', 0, 'next_at_ms', now)
    redis.call('HDEL', KEYS[i], 'failed_at_ms')
    redis.call('PERSIST', KEYS[i])
    redis.call('ZADD', KEYS[1], now, msg_id)
    redis.call('XDEL', KEYS[2], entry_id)
    redriven = redriven + 1
  elseif not status then
    expired = expired + 1
  else
    redis.call('XDEL', KEYS[2], entry_id)
    skipped = skipped + 1
  end
end
return {redriven, expired, skipped}
