-- wh_ep_rotate: give an endpoint a new secret; the current one keeps signing (a second
-- signature) until ARGV[2], so receivers can switch over without a gap.
-- KEYS (one slot {wh:<tenant>}): 1 endpoint hash
-- ARGV: 1 new secret, 2 previous secret valid until (ms)
-- Returns 'rotated' | 'missing'
local current = redis.call('HGET', KEYS[1], 'secret')
if not current then
  return 'missing'
end
redis.call('HSET', KEYS[1], 'secret', ARGV[1], 'previous_secret', current,
  'previous_expires_ms', ARGV[2])
return 'rotated'
