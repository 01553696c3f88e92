-- start: a worker takes a delivered entry: fence with a lease, move the job to processing,
-- count the delivery and the attempt, append the `started` event.
-- KEYS (one slot): 1 job hash, 2 lease, 3 events stream, 4 work stream, 5 claim key (optional)
-- ARGV: 1 lease token, 2 ttl_ms, 3 consumer, 4 entry_id, 5 group, 6 event_id,
--       7 events_maxlen, 8 started event name, 9 claim_ttl_ms
-- Returns {'started', flat job hash...} | {'unknown'} | {'skip', status} | {'stale'} | {'busy'}
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'unknown'}
end
local st = redis.call('HMGET', KEYS[1], 'status', 'entry_id')
local status, entry = st[1], st[2]
if status == 'completed' or status == 'failed' or status == 'canceled' then
  -- a duplicate delivery of a finished (or canceled-while-queued) job: drop the entry
  ack(KEYS[4], ARGV[5], ARGV[4])
  return {'skip', status}
end
if entry ~= ARGV[4] then
  -- an older entry of a job that has since been re-enqueued (retry, redrive)
  ack(KEYS[4], ARGV[5], ARGV[4])
  return {'stale'}
end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then
  return {'busy'}
end
if not can_move(status, 'processing') then
  return {'busy'}
end
local now = now_ms()
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'deliveries', 1)
local attempt = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'status', 'processing', 'stage', 'started', 'worker', ARGV[3],
  'started_at_ms', now, 'updated_at_ms', now, 'lease_until_ms', now + tonumber(ARGV[2]))
if KEYS[5] then
  local job_id = redis.call('HGET', KEYS[1], 'id')
  set_claim(KEYS[5], job_id, 'PROCESSING', ARGV[9])
end
emit(KEYS[3], ARGV[7], KEYS[1], ARGV[6], ARGV[8], '"attempt":' .. attempt)
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, 'started')
return out
