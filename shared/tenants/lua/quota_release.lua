-- release: the compensation. Gives the job's reservation back (a refused submission, a job
-- that failed, was canceled, dead-lettered or expired). At most once per job, and never
-- after a settle; a job that never reserved records nothing.
-- KEYS (one slot, the tenant's): 1 reservations, 2 saga ledger of the job
-- ARGV: 1 job_id, 2 reason, 3 saga ttl ms
-- Returns {'released', amount_ms} | {'noop', why}
local done = redis.call('HMGET', KEYS[2], 'reserve', 'settle', 'release')
if not done[1] then return {'noop', 'unreserved'} end
if done[2] then return {'noop', 'settled'} end
if done[3] then return {'noop', 'released'} end
local amount = 0
local r = redis.call('HGET', KEYS[1], ARGV[1])
if r then
  local pid
  pid, amount = parse_reservation(r)
  unreserve(key_tag(KEYS[1]) .. ':usage:' .. pid, amount)
  redis.call('HDEL', KEYS[1], ARGV[1])
end
redis.call('HSET', KEYS[2], 'release', now_ms() .. '|' .. amount .. '|' .. ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {'released', tostring(amount)}
