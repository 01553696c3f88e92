-- redrive: put a dead-lettered job back in line: failed -> queued (an edge of the state
-- machine), deliveries reset, a fresh stream entry, its claim live again, a `queued` event,
-- and the dead-letter entry removed -- in one step, so a redrive happens once or not at all.
-- KEYS (one slot): 1 dead-letter stream, 2 job hash, 3 work stream, 4 events stream,
--                  5 claim key (optional)
-- ARGV: 1 dead-letter entry id, 2 stream_maxlen, 3 event_id, 4 events_maxlen,
--       5 queued event name, 6 claim_ttl_ms, 7 event extra JSON,
--       optional (the redriver and `splatq dlq`): 8 audit record (JSON array of field, value
--       pairs: what, why, which policy or person), 9 audit ttl ms, 10 hint (JSON array of
--       job field, value pairs, e.g. a smaller batch for a job that ran out of memory),
--       11 fair-scheduling policy (JSON, as enqueue's) or '' for straight into the stream:
--       with it, the job waits in its tenant's redrive flow (`redrive:<tenant>`), a tenant
--       of its own in the round-robin, so a mass redrive takes one share of the stream
--       instead of standing in front of every live job
-- The audit record goes to the job's audit trail `<job key>:audit`, a key derived from the
-- declared job key by a suffix (same {pN} tag, same slot), in the same step as the redrive.
-- Returns {'redriven', new entry id} | {'gone'} | {'not_redrivable', why}
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return {'gone'}
end
local st = redis.call('HMGET', KEYS[2], 'status', 'id', 'trace_id')
local status, job_id = st[1], st[2]
if not status then
  return {'not_redrivable', 'no job record'}
end
if not can_move(status, 'queued') then
  return {'not_redrivable', 'job is ' .. status}
end
local now = now_ms()
redis.call('HSET', KEYS[2], 'status', 'queued', 'stage', 'redriven', 'deliveries', 0,
  'delivery_charge', 0, 'lapses', '',
  'updated_at_ms', now, 'cancel_requested', '0')
redis.call('HDEL', KEYS[2], 'error_code', 'error_message', 'error_retryable', 'completed_at_ms')
redis.call('HINCRBY', KEYS[2], 'redrives', 1)
if ARGV[10] and ARGV[10] ~= '' then
  redis.call('HSET', KEYS[2], unpack(cjson.decode(ARGV[10])))
end
redis.call('PERSIST', KEYS[2])
backlog_add(KEYS[2], now)
local entry_id
if ARGV[11] and ARGV[11] ~= '' then
  local policy = cjson.decode(ARGV[11])
  local tag = key_tag(KEYS[2])
  local f = redis.call('HMGET', KEYS[2], 'tenant', 'stream')
  local stream_name = f[2] or string.match(KEYS[3], '([^:]+)$')
  local flow = 'redrive:' .. (f[1] or '')
  redis.call('HSET', KEYS[2], 'fq', '1', 'entry_id', '', 'fq_flow', flow, 'fq_cost', policy.cost)
  fair_push(tag, stream_name, flow, job_id, policy.cost, policy.weight, 0, now)
  fair_keep_one_ready(tag, stream_name, KEYS[3], policy.group, policy.quantum, ARGV[2])
  entry_id = redis.call('HGET', KEYS[2], 'entry_id')
else
  entry_id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*',
    'v', '1', 'job', job_id, 'trace', st[3] or '', 'claim', KEYS[5] or '')
  redis.call('HSET', KEYS[2], 'entry_id', entry_id)
end
if KEYS[5] then
  local held = claim_holder(KEYS[5])
  if not held or held[2] == job_id then
    redis.call('SET', KEYS[5], 'PENDING ' .. job_id, 'PX', ARGV[6])
  end
end
emit(KEYS[4], ARGV[4], KEYS[2], ARGV[3], ARGV[5], ARGV[7])
redis.call('XDEL', KEYS[1], ARGV[1])
if ARGV[8] and ARGV[8] ~= '' then
  local audit = KEYS[2] .. ':audit'
  redis.call('XADD', audit, 'MAXLEN', '~', 100, '*', 'at_ms', now, 'entry', ARGV[1],
    'new_entry', entry_id, unpack(cjson.decode(ARGV[8])))
  redis.call('PEXPIRE', audit, ARGV[9])
end
return {'redriven', entry_id}
