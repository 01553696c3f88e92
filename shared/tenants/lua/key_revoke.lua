-- key_revoke: remove one API key of a tenant (its hash and its record) in one step.
-- KEYS (one slot, the registry's): 1 key hashes, 2 the tenant's keys, 3 the key registry's
--       version (bumped: gateways drop what they cached)
-- ARGV: 1 key_id
-- Returns {'ok'} | {'no_key'}
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then return {'no_key'} end
redis.call('HDEL', KEYS[1], cjson.decode(old)['sha256'])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('INCR', KEYS[3])
return {'ok'}
