-- wh_ep_create: register a webhook endpoint under the tenant's limit.
-- KEYS (one slot {wh:<tenant>}): 1 the tenant's endpoint index, 2 the endpoint hash
-- ARGV: 1 endpoint id, 2 limit, 3 subscribed event types (comma-separated), 4.. field/value
-- Returns 'created' | 'limit' | 'exists'
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[2]) then
  return 'limit'
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 'exists'
end
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 'created'
