-- task_claim: take the lease lock of one scheduled task run (shared/maintenance/). Two
-- replicas never run a task at once: the lock is a PX key holding '<holder>:<fence>', the
-- fence a counter in the task's state that every claim increments. A scheduled slot that a
-- finished run already covered is refused ('done'), so each slot runs once whoever asks. A
-- run that stopped unfinished (its holder crashed: the lock expired) left its checkpoint in
-- the state; the next claim hands it back, so the work resumes where it stopped.
-- KEYS (one slot {task:<name>}): 1 lock, 2 state hash
-- ARGV: 1 holder, 2 lock ttl ms, 3 slot ms (the scheduled time the run covers),
--       4 trigger ('schedule' | 'manual')
-- Returns {'claimed', token, fence, checkpoint, resumed ('1'|'0')} | {'busy', holder token}
--       | {'done', last slot ms} | {'backoff', retry at ms}
local held = redis.call('GET', KEYS[1])
if held then
  return {'busy', held}
end
local st = redis.call('HMGET', KEYS[2], 'last_slot_ms', 'running', 'checkpoint',
  'retry_at_ms')
local now = now_ms()
local slot = tonumber(ARGV[3])
if ARGV[4] ~= 'manual' then
  if st[1] and tonumber(st[1]) >= slot then
    return {'done', st[1]}
  end
  if st[4] and tonumber(st[4]) > now then
    return {'backoff', st[4]}
  end
end
local fence = redis.call('HINCRBY', KEYS[2], 'fence', 1)
local token = ARGV[1] .. ':' .. fence
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
local resumed = '0'
local checkpoint = ''
if st[2] == '1' then
  resumed = '1'
  checkpoint = st[3] or ''
end
redis.call('HSET', KEYS[2], 'running', '1', 'run_slot_ms', slot, 'run_trigger', ARGV[4],
  'run_holder', token, 'run_started_ms', now, 'run_resumed_from', checkpoint,
  'checkpoint', checkpoint)
return {'claimed', token, fence, checkpoint, resumed}
