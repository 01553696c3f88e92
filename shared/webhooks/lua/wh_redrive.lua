-- wh_redrive: send dead-lettered messages again (`recover`, `splatq dlq redrive --kind
-- webhooks`): each failed message becomes pending with a fresh attempt budget, due now, and
-- leaves the dead-letter stream and its (tenant, target) index. A message whose hash has
-- expired cannot be sent again (its payload is gone); its entry stays for the operator to
-- purge. An index member whose entry is no longer in the stream (purged, or trimmed by
-- MAXLEN) is not a dead letter any more: the member is dropped, the message left alone.
-- KEYS (one slot): 1 due zset, 2 webhook dead letters, then per message: its hash, its
--       (tenant, target) dead-letter index
-- ARGV: per message, its dead-letter entry id then its message id; optionally (the redriver
--       and `splatq dlq`) one more: an audit record (JSON array of field, value pairs: what,
--       why, which policy or person) appended to each redriven message's audit trail
--       `<message key>:audit` (a key derived by suffix: same {pN} tag, same slot), kept
--       30 days
-- Returns {redriven, expired, skipped (already pending or delivered, or its entry gone:
-- entry and member removed)}
local now = now_ms()
local redriven, expired, skipped = 0, 0, 0
local audit = nil
if #ARGV % 2 == 1 then audit = cjson.decode(ARGV[#ARGV]) end
for i = 3, #KEYS, 2 do
  local n = i - 3
  local entry_id, msg_id = ARGV[n + 1], ARGV[n + 2]
  local msg_key, index_key = KEYS[i], KEYS[i + 1]
  local member = entry_id .. ' ' .. msg_id
  if #redis.call('XRANGE', KEYS[2], entry_id, entry_id) == 0 then
    redis.call('ZREM', index_key, member)
    skipped = skipped + 1
  else
    local status = redis.call('HGET', msg_key, 'status')
    if status == 'failed' then
      redis.call('HSET', msg_key, 'status', 'pending', 'attempts', 0, 'next_at_ms', now)
      redis.call('HDEL', msg_key, 'failed_at_ms')
      redis.call('PERSIST', msg_key)
      redis.call('ZADD', KEYS[1], now, msg_id)
      redis.call('XDEL', KEYS[2], entry_id)
      redis.call('ZREM', index_key, member)
      redis.call('HINCRBY', msg_key, 'redrives', 1)
      if audit then
        local trail = msg_key .. ':audit'
        redis.call('XADD', trail, 'MAXLEN', '~', 100, '*', 'at_ms', now, 'entry', entry_id,
          unpack(audit))
        redis.call('PEXPIRE', trail, 30 * 24 * 3600 * 1000)
      end
      redriven = redriven + 1
    elseif not status then
      expired = expired + 1
    else
      redis.call('XDEL', KEYS[2], entry_id)
      redis.call('ZREM', index_key, member)
      skipped = skipped + 1
    end
  end
end
return {redriven, expired, skipped}
