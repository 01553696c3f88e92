-- cleanup_done: a finished staged job's intermediates were deleted: its ledger records the
-- cleanup stage (when the record still exists), the other stages' records drop the names of
-- the deleted outputs and keep of their digest what names their metered unit, and the
-- cleanup entry is acked and removed.
-- KEYS (one slot): 1 job hash, 2 cleanup stream
-- ARGV: 1 group, 2 entry id, 3 the cleanup stage's ledger record (JSON), 4 how many of a
--       digest's characters name a unit (shared/engine/metering.py; absent: keep it whole)
-- Returns 1 when the job record was updated, 0 when it had expired. Safe to replay.
local updated = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- The stages' outputs were the objects just deleted: their names name nothing any more,
  -- and the record would keep them for its whole retention. Each record keeps the rest:
  -- what the API reads (status, attempts, times, facts) and what ties it to its metered
  -- unit: the digest's first characters, all that `m.<stage>.<digest>` keeps of it
  -- (shared/engine/metering.py). A shortened digest never matches a stage's input digest
  -- again, so nothing would reuse the deleted outputs (they are gone either way).
  local unit_chars = tonumber(ARGV[4] or '')
  local sets = {'ps.cleanup', ARGV[3]}
  local flat = redis.call('HGETALL', KEYS[1])
  for i = 1, #flat, 2 do
    local name, value = flat[i], flat[i + 1]
    if string.sub(name, 1, 3) == 'ps.' and name ~= 'ps.cleanup'
        and string.find(value, '"outputs"', 1, true) then
      local ok, record = pcall(cjson.decode, value)
      if ok and type(record) == 'table' then
        record.outputs = nil
        if unit_chars and type(record.digest) == 'string' then
          record.digest = string.sub(record.digest, 1, unit_chars)
        end
        sets[#sets + 1] = name
        sets[#sets + 1] = cjson.encode(record)
      end
    end
  end
  redis.call('HSET', KEYS[1], unpack(sets))
  updated = 1
end
ack(KEYS[2], ARGV[1], ARGV[2])
return updated
