-- settle: saga step 3. Charges the job's measured GPU time and gives back its reservation,
-- in the period the reservation was made in. At most once per job. A job whose reservation
-- was released already (it failed, then was redriven and completed) is charged in the
-- current period; a job that never reserved is not charged (it did not pass the gateway's
-- quota).
-- KEYS (one slot, the tenant's): 1 reservations, 2 saga ledger, 3 quota,
--       4 usage of the current day, 5 usage of the current month
-- ARGV: 1 job_id, 2 measured ms, 3 saga ttl ms, 4 usage ttl ms
-- Returns {'settled', charged_ms, reserved_ms} | {'noop', why}
local done = redis.call('HMGET', KEYS[2], 'reserve', 'settle')
if not done[1] then return {'noop', 'unreserved'} end
if done[2] then return {'noop', 'settled'} end
local measured = math.max(0, math.floor(tonumber(ARGV[2]) or 0))
local amount = 0
local usage
local r = redis.call('HGET', KEYS[1], ARGV[1])
if r then
  local pid
  pid, amount = parse_reservation(r)
  usage = key_tag(KEYS[1]) .. ':usage:' .. pid
  unreserve(usage, amount)
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  usage = redis.call('HGET', KEYS[3], 'period') == 'day' and KEYS[4] or KEYS[5]
end
redis.call('HINCRBY', usage, 'used_ms', measured)
keep_for(usage, tonumber(ARGV[4]))
redis.call('HSET', KEYS[2], 'settle', now_ms() .. '|' .. measured .. '|' .. amount)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {'settled', tostring(measured), tostring(amount)}
