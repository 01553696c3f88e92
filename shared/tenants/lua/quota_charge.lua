-- charge: the saga's closing step for a job whose end is charged (shared/tenants/charging.py).
-- Charges each metered unit of work the job holds that this job's ledger has not charged yet
-- (`u.<unit>`: once per unit, whatever happens to the job afterwards), and closes the job's
-- reservation if it is still open, in the period the reservation was made in (a job with no
-- open reservation -- it failed and was redriven -- is charged in the current period). A job
-- that never reserved is not charged (it did not pass the gateway's quota).
-- KEYS (one slot, the tenant's): 1 reservations, 2 saga ledger, 3 quota,
--       4 usage of the current day, 5 usage of the current month
-- ARGV: 1 job_id, 2 outcome (completed|canceled|failed), 3 saga ttl ms, 4 usage ttl ms,
--       5.. unit, measured ms pairs
-- Returns {'charged', charged_ms (now), reserved_ms (closed now), total_ms (this job, ever)} |
--         {'noop', why}. Safe to resend: a resend finds every unit charged and no
--         reservation open.
local done = redis.call('HMGET', KEYS[2], 'reserve', 'charged_ms')
if not done[1] then return {'noop', 'unreserved'} end
local total = tonumber(done[2]) or 0
local delta = 0
local now = now_ms()
for i = 5, #ARGV, 2 do
  local ms = math.max(0, math.floor(tonumber(ARGV[i + 1]) or 0))
  if redis.call('HSETNX', KEYS[2], 'u.' .. ARGV[i], ms) == 1 then delta = delta + ms end
end
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
if delta == 0 and not r then return {'noop', 'charged'} end
if delta > 0 then
  redis.call('HINCRBY', usage, 'used_ms', delta)
  keep_for(usage, tonumber(ARGV[4]))
end
total = total + delta
redis.call('HSET', KEYS[2], 'charged_ms', total, 'charge', now .. '|' .. delta .. '|' .. ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {'charged', tostring(delta), tostring(amount), tostring(total)}
