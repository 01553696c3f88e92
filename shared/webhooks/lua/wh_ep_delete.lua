-- wh_ep_delete: remove an endpoint. Its pending messages are dropped when next due.
-- KEYS (one slot {wh:<tenant>}): 1 endpoint index, 2 endpoint hash
-- ARGV: 1 endpoint id
-- Returns 1 if it existed
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2] .. ':attempts')  -- its attempt log (wh_ep_log.lua), same slot
return redis.call('DEL', KEYS[2])
