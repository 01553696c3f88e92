-- hold: keep (renew) or take over (adopt) the slot of a prediction that runs at the vendor.
-- A renewal extends only a slot still held (a renewal racing the release must not bring it
-- back); an adoption -- a job resuming a prediction its killed run created -- takes the slot
-- even past the limit: the vendor counts that prediction whether or not we do, so our count
-- must too (new permits wait until it ends).
-- KEYS (one slot): 1 slots, 2 tenant slots (ignored unless ARGV[3] = '1')
-- ARGV: 1 member, 2 slot ttl ms, 3 tenant limited '1'|'0', 4 mode 'renew'|'adopt'
-- Returns 1 (held) | 0 (a renewal found it gone). Safe to resend.
local now = now_ms()
local until_ms = now + tonumber(ARGV[2])
local flag = 'XX'
if ARGV[4] == 'adopt' then flag = 'GT' end
redis.call('ZADD', KEYS[1], flag, until_ms, ARGV[1])
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ARGV[3] == '1' and held then
  redis.call('ZADD', KEYS[2], flag, until_ms, ARGV[1])
end
if held then return 1 end
return 0
