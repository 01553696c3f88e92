-- wh_claim: take a due message for one delivery attempt. Its due time moves past the attempt
-- timeout (a visibility timeout): a dispatcher killed mid-attempt leaves the message due
-- again afterwards, so it is delivered at least once.
-- KEYS (one slot): 1 due zset, 2 message hash
-- ARGV: 1 message id, 2 visibility ms
-- Returns {'claimed', flat message hash...} | {'skip'}
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local now = now_ms()
if not score or tonumber(score) > now then
  return {'skip'}
end
if redis.call('HGET', KEYS[2], 'status') ~= 'pending' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return {'skip'}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HINCRBY', KEYS[2], 'attempts', 1)
local out = redis.call('HGETALL', KEYS[2])
table.insert(out, 1, 'claimed')
return out
