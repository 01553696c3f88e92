-- promote: move one due job from the delayed set back into its work stream (a retry).
-- KEYS (one slot): 1 delayed zset, 2 job hash, 3 work stream
-- ARGV: 1 member ('<stream>|<job_id>'), 2 stream_maxlen
-- Returns {'promoted', entry_id} | {'not_due'} | {'gone'} | {'skip', status}
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return {'gone'}
end
if tonumber(score) > now_ms() then
  return {'not_due'}
end
redis.call('ZREM', KEYS[1], ARGV[1])
local st = redis.call('HMGET', KEYS[2], 'status', 'id', 'trace_id', 'claim_key')
if st[1] ~= 'retrying' then
  return {'skip', st[1] or 'missing'}
end
local entry_id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*',
  'v', '1', 'job', st[2], 'trace', st[3] or '', 'claim', st[4] or '')
redis.call('HSET', KEYS[2], 'entry_id', entry_id, 'stage', 'queued', 'updated_at_ms', now_ms())
redis.call('HDEL', KEYS[2], 'next_attempt_at_ms')
return {'promoted', entry_id}
