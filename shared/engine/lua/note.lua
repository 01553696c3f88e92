-- note: a running job's own notes, written by its run under the lease fence -- what the run
-- must find again if it dies (a remote backend's prediction id, recorded before it waits on
-- it, so the run that takes over resumes that prediction instead of paying for a second) and
-- what users should see of it (the vendor's request id, the upstream latency). Only fields
-- named `note.<name>` are written. Optionally appends a `progress` event whose extra JSON
-- carries them to SSE and webhooks.
-- KEYS (one slot): 1 job hash, 2 events stream
-- ARGV: 1 lease token, 2 event name ('' = none), 3 event id, 4 events_maxlen,
--       5 event extra JSON, 6.. field/value pairs (names `note.*`)
-- Returns {'ok', cancel requested '1'|'0'} | {'lease_lost'} | {'bad_field', name}.
-- Memoized (scripts.py): a resend answers as the first execution did, one event only.
local st = redis.call('HMGET', KEYS[1], 'lease_token', 'cancel_requested')
if ARGV[1] == '' or st[1] ~= ARGV[1] then
  return {'lease_lost'}
end
local sets = {'updated_at_ms', now_ms()}
for i = 6, #ARGV, 2 do
  if string.sub(ARGV[i], 1, 5) ~= 'note.' then return {'bad_field', ARGV[i]} end
  sets[#sets + 1] = ARGV[i]
  sets[#sets + 1] = ARGV[i + 1]
end
redis.call('HSET', KEYS[1], unpack(sets))
if ARGV[2] ~= '' then
  emit(KEYS[2], ARGV[4], KEYS[1], ARGV[3], ARGV[2], ARGV[5])
end
return {'ok', st[2] == '1' and '1' or '0'}
