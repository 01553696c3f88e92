-- wh_fanout: turn one outbox event into its delivery messages (one per target) and ack the
-- event, in one step: a dispatcher that dies before this runs re-reads the event; one that
-- dies after it finds the messages already there (each is created once).
-- KEYS (one slot {pN}): 1 events stream, 2 due zset, 3.. message hashes
-- ARGV: 1 group, 2 events entry id, then per message: message id followed by 8 field values
--       (event_id, event_type, job_id, tenant, url, payload, target, created_ms)
-- Returns the number of messages created
local created = 0
local now = now_ms()
local names = {'event_id', 'event_type', 'job_id', 'tenant', 'url', 'payload', 'target',
  'created_ms'}
for i = 3, #KEYS do
  local base = 3 + (i - 3) * 9
  local msg_id = ARGV[base]
  if redis.call('EXISTS', KEYS[i]) == 0 then
    local fields = {'status', 'pending', 'attempts', 0, 'next_at_ms', now}
    for j = 1, 8 do
      fields[#fields + 1] = names[j]
      fields[#fields + 1] = ARGV[base + j]
    end
    redis.call('HSET', KEYS[i], unpack(fields))
    redis.call('ZADD', KEYS[2], 'NX', now, msg_id)
    created = created + 1
  end
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return created
