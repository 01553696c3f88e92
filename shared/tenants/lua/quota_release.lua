-- release: the compensation. Gives the job's open reservation back without charging anything
-- (a refused submission; a job whose end is waived: a platform fault, an expired record --
-- shared/tenants/charging.py). A reservation is closed once, by a release or by a charge; a
-- job that never reserved records nothing. Charging the job's work later (it is redriven and
-- completes) is still possible: that is quota_charge's business, unit by unit.
-- KEYS (one slot, the tenant's): 1 reservations, 2 saga ledger of the job
-- ARGV: 1 job_id, 2 reason, 3 saga ttl ms
-- Returns {'released', amount_ms} | {'noop', why}. Safe to resend: the reservation is gone.
if redis.call('HEXISTS', KEYS[2], 'reserve') == 0 then return {'noop', 'unreserved'} end
local r = redis.call('HGET', KEYS[1], ARGV[1])
if not r then return {'noop', 'closed'} end
local pid, amount = parse_reservation(r)
unreserve(key_tag(KEYS[1]) .. ':usage:' .. pid, amount)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'release', now_ms() .. '|' .. amount .. '|' .. ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {'released', tostring(amount)}
