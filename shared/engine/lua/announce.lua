-- announce: a running job's one-off event, sent from inside its run (e.g. preview_ready the
-- moment a progressive job's quick result is committed, while its stage still runs). Fenced
-- by the run's lease token, and once per job: the field `announced.<event>` records it (a
-- redrive may clear it to allow one more). Extra job fields are written in the same step.
-- KEYS (one slot): 1 job hash, 2 events stream
-- ARGV: 1 lease token, 2 event name, 3 event id, 4 events_maxlen, 5 event extra JSON,
--       6.. field/value pairs for the job hash
-- Returns {'ok'} | {'already'} | {'lease_lost'}. Safe to resend: a resend finds the field.
local st = redis.call('HMGET', KEYS[1], 'lease_token', 'announced.' .. ARGV[2])
if st[2] and st[2] ~= '' then
  return {'already'}
end
if ARGV[1] == '' or st[1] ~= ARGV[1] then
  return {'lease_lost'}
end
local sets = {'announced.' .. ARGV[2], now_ms()}
for i = 6, #ARGV do sets[#sets + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(sets))
emit(KEYS[2], ARGV[4], KEYS[1], ARGV[3], ARGV[2], ARGV[5])
return {'ok'}
