-- key_put: add an API key to a tenant, optionally retiring another of its keys at a time
-- (a rotation: both in one step, so a crash never leaves the tenant without a key).
-- KEYS (one slot, the registry's): 1 tenant index, 2 key hashes, 3 the tenant's keys,
--       4 the key registry's version (bumped: gateways drop what they cached)
-- ARGV: 1 tenant, 2 key_id, 3 sha256 hex, 4 record JSON, 5 retired key_id ('' = none),
--       6 retired key's expires_ms (its last valid instant)
-- Returns {'ok'} | {'no_tenant'} | {'no_key'} (the key to retire does not exist)
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return {'no_tenant'} end
if ARGV[5] ~= '' then
  local old = redis.call('HGET', KEYS[3], ARGV[5])
  if not old then return {'no_key'} end
  local rec = cjson.decode(old)
  rec['expires_ms'] = tonumber(ARGV[6])
  redis.call('HSET', KEYS[3], ARGV[5], cjson.encode(rec))
  redis.call('HSET', KEYS[2], rec['sha256'], ARGV[1] .. '|' .. ARGV[5] .. '|' .. ARGV[6])
end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[1] .. '|' .. ARGV[2] .. '|0')
redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
redis.call('INCR', KEYS[4])
return {'ok'}
