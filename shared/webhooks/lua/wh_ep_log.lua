-- wh_ep_log: append delivery attempts to an endpoint's attempt log (GET
-- /v1/webhook-endpoints/{id}/attempts), a stream capped at ARGV[1] entries and kept ARGV[2]
-- ms after its last write. Nothing is written for an endpoint that is gone (a deleted
-- endpoint's log was deleted with it; it must not come back).
-- KEYS (one slot {wh:<tenant>}): 1 endpoint hash, 2 its attempt log
-- ARGV: 1 maxlen, 2 ttl ms, 3.. attempt records (JSON), oldest first
-- Returns the number appended
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
for i = 3, #ARGV do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'a', ARGV[i])
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return #ARGV - 2
