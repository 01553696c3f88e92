-- renew: extend a lease only if this worker still holds the job's run, and refresh the
-- entry's idle time (XCLAIM to itself, JUSTID: no delivery counted) so the reaper leaves it
-- alone. The fence is the job hash's `lease_token` (set by start_entry, cleared by finish and
-- by reclaim): a holder whose lease key lapsed -- a Redis outage, a stall -- while nobody
-- took the job over gets its lease back; one that was taken over is told it lost it.
-- KEYS (one slot): 1 lease, 2 job hash, 3 work stream
-- ARGV: 1 token, 2 ttl_ms, 3 group, 4 consumer, 5 entry_id, 6 jobs running in this worker's process
-- Returns 0 (lease lost: stop, commit nothing) | 1 (renewed) | 2 (renewed; cancel requested)
if not holds_run(KEYS[2], ARGV[1]) then
  return 0
end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
-- The lease's deadline and the fleet's outage total as of now: reclaim.lua extends the
-- deadline by any outage counted after this renewal.
redis.call('HSET', KEYS[2], 'lease_until_ms', now_ms() + tonumber(ARGV[2]),
  'outage_mark', fleet_outage(key_tag(KEYS[2]) .. ':fleet'), 'co_running', ARGV[6])
redis.call('XCLAIM', KEYS[3], ARGV[3], ARGV[4], 0, ARGV[5], 'JUSTID')
if redis.call('HGET', KEYS[2], 'cancel_requested') == '1' then
  return 2
end
return 1
