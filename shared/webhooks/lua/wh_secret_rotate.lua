-- wh_secret_rotate: give a tenant a new signing secret for its jobs' webhook_urls; the
-- current one keeps signing (a second signature) for the overlap.
-- KEYS (one slot {tenant:<tenant>}): 1 current secret, 2 previous secret
-- ARGV: 1 new secret, 2 overlap ms
-- Returns the new secret
local current = redis.call('GET', KEYS[1])
if current and tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[2], current, 'PX', ARGV[2])
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
