-- cleanup_done: a finished staged job's intermediates were deleted: its ledger records the
-- cleanup stage (when the record still exists) and the cleanup entry is acked and removed.
-- KEYS (one slot): 1 job hash, 2 cleanup stream
-- ARGV: 1 group, 2 entry id, 3 the cleanup stage's ledger record (JSON)
-- Returns 1 when the job record was updated, 0 when it had expired. Safe to replay.
local updated = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'ps.cleanup', ARGV[3])
  updated = 1
end
ack(KEYS[2], ARGV[1], ARGV[2])
return updated
