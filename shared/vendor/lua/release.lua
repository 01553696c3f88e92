-- release: a prediction's slot is free again (the vendor answered it, failed it, or it was
-- never created); the member leaves the line too, and gives up a probe it held without
-- reporting (a canceled call: another waiter may probe).
-- KEYS (one slot): 1 slots, 2 tenant slots, 3 holders, 4 waiting, 5 seen, 6 breaker
-- ARGV: 1 member
-- Returns 1 when a slot was held. Safe to resend.
local member = ARGV[1]
local had = redis.call('ZREM', KEYS[1], member)
redis.call('ZREM', KEYS[2], member)
redis.call('HDEL', KEYS[3], member)
leave_line(KEYS[4], KEYS[5], member)
if redis.call('HGET', KEYS[6], 'probe') == member then
  redis.call('HDEL', KEYS[6], 'probe', 'probe_until')
end
return had
