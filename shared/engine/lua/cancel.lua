-- cancel: the user's cancel. Queued or retrying jobs end `canceled` at once (their stream
-- entry is dropped by whichever worker reads it; a job still waiting in its tenant's fair
-- queue leaves that queue here, so the feed never meets it); a processing job gets a flag
-- its worker sees on the next heartbeat or progress report.
-- Safe to resend: a second run finds the job canceled and writes nothing.
-- KEYS (one slot): 1 job hash, 2 delayed zset, 3 events stream, 4 claim key (optional)
-- ARGV: 1 event_id, 2 events_maxlen, 3 canceled event name, 4 retention_ms, 5 claim_ttl_ms,
--       6 tenant ('' = any tenant), 7 delayed member
-- Returns {'not_found'} | {'already_finished', status} | {'cancel_requested'} | {'canceled'}
local st = redis.call('HMGET', KEYS[1], 'status', 'tenant', 'id', 'stream', 'current_stage',
  'fq', 'fq_flow', 'fq_cost')
local status, tenant, job_id = st[1], st[2], st[3]
if not status or (ARGV[6] ~= '' and tenant ~= ARGV[6]) then
  return {'not_found'}
end
if status == 'processing' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1', 'updated_at_ms', now_ms())
  return {'cancel_requested'}
end
if not can_move(status, 'canceled') then
  return {'already_finished', status}
end
local now = now_ms()
redis.call('HSET', KEYS[1], 'status', 'canceled', 'stage', 'canceled', 'cancel_requested', '1',
  'completed_at_ms', now, 'updated_at_ms', now)
redis.call('ZREM', KEYS[2], ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
backlog_done(KEYS[1])
if st[6] == '1' then fair_withdraw(KEYS[1], job_id, st[4], st[7], st[8]) end
fair_release_of(KEYS[1])
stage_cleanup(KEYS[1], job_id, st[4], st[5])
if KEYS[4] then set_claim(KEYS[4], job_id, 'FAILED', ARGV[5]) end
emit(KEYS[3], ARGV[2], KEYS[1], ARGV[1], ARGV[3], '')
return {'canceled'}
