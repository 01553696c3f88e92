-- finish: the worker's compare-and-set exit from `processing`: to completed, failed,
-- canceled, retrying (parked in the delayed set) or queued (released without burning an
-- attempt). Fenced by the run's lease token in the job hash (see renew.lua): a worker whose
-- job was taken over commits nothing; one whose lease key merely lapsed while nobody took
-- the job still commits.
-- KEYS (one slot): 1 job hash, 2 lease, 3 work stream, 4 events stream, 5 delayed zset,
--                  6 the entry stream of the job's class (where its tenant's fair queue
--                  feeds: the same key as 3 for a whole-job worker), 7 claim key (optional),
--                  last: dead-letter stream (when ARGV[19] is set)
-- ARGV: 1 token, 2 entry_id, 3 group, 4 target status, 5 event name ('' = none),
--       6 event_id, 7 events_maxlen, 8 event extra JSON, 9 retention_ms (terminal only),
--       10 retry delay ms (retrying only), 11 delayed member, 12 claim status ('' = keep),
--       13 claim_ttl_ms, 14 entry mode 'ack'|'handoff', 15 handoff consumer,
--       16 handoff idle ms, 17 canceled event name, 18 request id,
--       19 dead-letter reason ('' = none: a `failed` job whose error a redrive policy may
--       act on, e.g. CUDA_OUT_OF_MEMORY, is also dead-lettered under that reason),
--       20 dlq_maxlen, 21 the fair feed's 'quantum stream_maxlen' (a capped tenant's
--       freed slot makes its next job ready at once: fair_release), 22.. field/value pairs
-- A staged job's completed or canceled exit also queues its cleanup (stage_cleanup).
-- Returns {'ok', status} | {'already', status} | {'lease_lost'} | {'illegal', status}
-- Safe to resend (a lost reply): the job hash keeps `last_commit` = '<request id> <status>'
-- of its last commit, written with the status itself, so a resend of that very call answers
-- what it answered the first time -- for as long as the job exists, at no extra command.
local target = ARGV[4]
local st = redis.call('HMGET', KEYS[1], 'status', 'cancel_requested', 'id', 'last_commit',
  'tenant', 'stream', 'lease_token', 'metadata', 'trace_id', 'backlog_counted', 'fq',
  'current_stage', 'watch', 'error_code')
local status, cancel, job_id = st[1], st[2], st[3]
if not status then
  return {'illegal', 'missing'}
end
local rid = ARGV[18]
if st[4] and string.sub(st[4], 1, #rid + 1) == rid .. ' ' then
  return {'ok', string.sub(st[4], #rid + 2)}
end
local terminal = (target == 'completed' or target == 'failed' or target == 'canceled')
if terminal and status == target then
  -- a repeated commit (retried call after a lost reply): effects happened once already
  ack(KEYS[3], ARGV[3], ARGV[2])
  return {'already', status}
end
if ARGV[1] == '' or st[7] ~= ARGV[1] then  -- holds_run, from the fields already read
  return {'lease_lost'}
end
-- A cancel that raced the end of the work wins: the user asked for no result.
if cancel == '1' and target ~= 'canceled' and target ~= 'failed' then
  target = 'canceled'
  terminal = true
end
if not can_move(status, target) then
  return {'illegal', status}
end
local now = now_ms()
-- Every field of the commit goes out in one HSET (fewer calls inside the script).
local sets = {}
if target ~= 'canceled' then
  for i = 22, #ARGV do sets[#sets + 1] = ARGV[i] end
else
  -- A canceled job's artifacts are not committed, whatever the worker computed; the work it
  -- metered (`m.<unit>`, shared/engine/metering.py) is, since it was done.
  for i = 22, #ARGV, 2 do
    if string.sub(ARGV[i], 1, 2) == 'm.' then
      sets[#sets + 1] = ARGV[i]
      sets[#sets + 1] = ARGV[i + 1]
    end
  end
end
local function put(name, value)
  sets[#sets + 1] = name
  sets[#sets + 1] = value
end
put('status', target); put('updated_at_ms', now); put('lease_until_ms', 0); put('worker', '')
put('lease_token', ''); put('last_commit', rid .. ' ' .. target)
local dlq = nil
if ARGV[19] ~= '' then dlq = KEYS[#KEYS] end
local claim_key = KEYS[7]
if claim_key == dlq then claim_key = nil end
if dlq and target == 'failed' then
  put('completed_at_ms', now); put('stage', 'dead_lettered')
elseif terminal then
  put('completed_at_ms', now); put('stage', target)
  if target == 'completed' then put('progress', 1) end
elseif target == 'retrying' then
  put('stage', 'retrying'); put('next_attempt_at_ms', now + tonumber(ARGV[10]))
elseif target == 'queued' then
  put('stage', 'queued')
end
redis.call('HSET', KEYS[1], unpack(sets))
redis.call('DEL', KEYS[2])
if terminal then
  if target == 'completed' and st[14] then
    -- an earlier attempt's error (the three error fields are written together)
    redis.call('HDEL', KEYS[1], 'error_code', 'error_message', 'error_retryable')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[9])
  if st[10] == '1' then backlog_done(KEYS[1], job_id, st[5], st[6]) end
  fair_release(KEYS[1], job_id, st[5] or '', st[6], st[11], {KEYS[6], ARGV[3], ARGV[21]})
  if target ~= 'failed' then
    stage_cleanup(KEYS[1], job_id, st[6], st[12])
  end
elseif target == 'retrying' then
  redis.call('ZADD', KEYS[5], now + tonumber(ARGV[10]), ARGV[11])
elseif target == 'queued' then
  -- released: the attempt and the delivery do not count
  redis.call('HINCRBY', KEYS[1], 'attempts', -1)
  redis.call('HINCRBY', KEYS[1], 'deliveries', -1)
end
if claim_key then
  local claim_status = ARGV[12]
  if target == 'canceled' then claim_status = 'FAILED' end
  if claim_status ~= '' then set_claim(claim_key, job_id, claim_status, ARGV[13]) end
end
if dlq and target == 'failed' then
  redis.call('XADD', dlq, 'MAXLEN', '~', ARGV[20], '*', 'job', job_id, 'entry', ARGV[2],
    'stream', st[6] or '', 'reason', ARGV[19], 'last_error',
    redis.call('HGET', KEYS[1], 'error_message') or '', 'at_ms', now)
end
local event_name = ARGV[5]
local extra = ARGV[8]
if target == 'canceled' then event_name = ARGV[17]; extra = '' end
if event_name ~= '' then
  emit(KEYS[4], ARGV[7], KEYS[1], ARGV[6], event_name, extra,
    {job_id, st[5], st[8], st[9], st[13]}, now)
end
if ARGV[14] == 'handoff' then
  -- Keep the entry pending (its place in line) but hand it to a parking consumer with an
  -- idle time past the reaper's threshold, so the next reaper pass re-delivers it.
  redis.call('XCLAIM', KEYS[3], ARGV[3], ARGV[15], 0, ARGV[2], 'IDLE', ARGV[16], 'JUSTID')
else
  ack(KEYS[3], ARGV[3], ARGV[2])
end
return {'ok', target}
