-- meter: record one unit of work a running job's run finished (a stage's outputs for one input
-- digest, a progressive job's quick result, a whole job), with the time it measured. Fenced by
-- the run's lease token; once per unit: the field `m.<unit>` keeps the first measurement, so a
-- retry or a resend that meters the same unit (it reused the outputs) adds nothing. The quota
-- settler charges a job's units (shared/tenants/charging.py); an empty `m.<unit>` is a unit a
-- redrive with --from-stage discarded.
-- KEYS (one slot): 1 job hash
-- ARGV: 1 lease token, 2 unit, 3 measured ms
-- Returns {'ok'} | {'already'} | {'lease_lost'}. Safe to resend: a resend finds the field.
local st = redis.call('HMGET', KEYS[1], 'lease_token', 'm.' .. ARGV[2])
if st[2] and st[2] ~= '' then
  return {'already'}
end
if ARGV[1] == '' or st[1] ~= ARGV[1] then
  return {'lease_lost'}
end
redis.call('HSET', KEYS[1], 'm.' .. ARGV[2], ARGV[3])
return {'ok'}
