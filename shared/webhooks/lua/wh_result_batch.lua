-- wh_result_batch: many finished attempts of one partition recorded in one script call --
-- wh_result.lua's logic, unchanged, once per message (first result wins, retry and deferred
-- scheduling, the dead letter and its (tenant, target) index, the attempt logs): a batch
-- pays the script call (and its replay memo) once, not once per message.
-- KEYS (one slot {pN}): 1 due zset, 2 webhook dead letters, then per message 3 keys: its
--   hash, its job's delivery log (or its hash again: a message of no job), its (tenant,
--   target) dead-letter index
-- ARGV: 1 log cap, 2 dead-letter maxlen, 3 retention ms, then per message 7 values: id,
--   outcome, delay ms, attempt record JSON, reason code, reason detail, '0' when it belongs
--   to no job (wh_result.lua's ARGV without the three shared values)
-- Returns one wh_result.lua reply (the message's new status) per message, in order; a
-- message whose recording raised an error answers {'error', message} and the others are
-- still recorded.
-- Safe to resend: memoized by the script runner (shared/engine/scripts.py) -- a retry or a
-- deferral leaves the message pending, so running it again would log it and reschedule it
-- twice; the memo holds only the short statuses.
--@include wh_result as result_one

local out = {}
local n = (#KEYS - 2) / 3
for i = 0, n - 1 do
  local k, a = 2 + i * 3, 3 + i * 7
  local keys = {KEYS[1], KEYS[k + 1], KEYS[k + 2], KEYS[2], KEYS[k + 3]}
  local args = {ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[1], ARGV[2], ARGV[3],
    ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]}
  out[#out + 1] = batch_member(result_one, keys, args)
end
return out
