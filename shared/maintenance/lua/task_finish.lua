-- task_finish: end a task run, fenced like task_renew. Success covers the run's slot (a
-- scheduled run: later claims of it or older slots answer 'done'), records the time (the
-- dead man's switch reads it) and clears the checkpoint; failure keeps the checkpoint for
-- the next attempt, after a backoff; an interrupted run (its process is stopping) keeps it
-- for whoever claims next, at once. Either way the run lands in the task's history and the
-- lock is released.
-- KEYS (one slot {task:<name>}): 1 lock, 2 state hash, 3 history stream
-- ARGV: 1 token, 2 fence, 3 outcome ('success'|'failure'|'interrupted'), 4 summary, 5 history maxlen,
--       6 retry backoff ms (failure)
-- Returns {'ok', finished at ms} | {'lost'}
local held = redis.call('GET', KEYS[1])
if held ~= ARGV[1] then
  if held or redis.call('HGET', KEYS[2], 'fence') ~= ARGV[2] then
    return {'lost'}
  end
end
local now = now_ms()
local st = redis.call('HMGET', KEYS[2], 'run_slot_ms', 'run_trigger', 'run_started_ms',
  'run_resumed_from', 'checkpoint', 'last_slot_ms')
if ARGV[3] == 'success' then
  local fields = {'last_success_ms', now, 'running', '0', 'checkpoint', ''}
  if st[2] ~= 'manual' and tonumber(st[1] or 0) > tonumber(st[6] or 0) then
    fields[#fields + 1] = 'last_slot_ms'
    fields[#fields + 1] = st[1]
  end
  redis.call('HSET', KEYS[2], unpack(fields))
  redis.call('HDEL', KEYS[2], 'retry_at_ms')
elseif ARGV[3] == 'failure' then
  redis.call('HSET', KEYS[2], 'last_failure_ms', now,
    'retry_at_ms', now + tonumber(ARGV[6]))
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'slot_ms', st[1] or '',
  'trigger', st[2] or '', 'holder', ARGV[1], 'started_ms', st[3] or '', 'finished_ms', now,
  'outcome', ARGV[3], 'resumed_from', st[4] or '', 'checkpoint', st[5] or '',
  'summary', ARGV[4])
redis.call('DEL', KEYS[1])
return {'ok', now}
