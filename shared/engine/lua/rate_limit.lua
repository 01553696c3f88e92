-- rate_limit: a per-tenant token bucket (refill `rate` tokens/s up to `burst`), taken
-- atomically so concurrent gateways share one budget.
-- KEYS (one slot {rl:<tenant>}): 1 bucket hash
-- ARGV: 1 rate per second, 2 burst, 3 cost
-- Returns {allowed 1|0, retry_after_ms, tokens left (floor)}
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local allowed, retry_ms = 0, 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry_ms = math.ceil((cost - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, retry_ms, math.floor(tokens)}
