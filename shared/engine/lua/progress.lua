-- progress: record a running job's progress and stage (fenced by its run's lease token, as
-- renew.lua explains); optionally
-- append a `progress` event (the worker throttles how often).
-- KEYS (one slot): 1 job hash, 2 lease, 3 events stream
-- ARGV: 1 token, 2 progress (0..1), 3 stage, 4 emit '1'|'0', 5 event_id, 6 events_maxlen,
--       7 progress event name, 8 event extra JSON
-- Returns 0 (lease lost) | 1 | 2 (cancel requested)
if not holds_run(KEYS[1], ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'progress', ARGV[2], 'stage', ARGV[3], 'updated_at_ms', now_ms())
if ARGV[4] == '1' then
  emit(KEYS[3], ARGV[6], KEYS[1], ARGV[5], ARGV[7], ARGV[8])
end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then
  return 2
end
return 1
