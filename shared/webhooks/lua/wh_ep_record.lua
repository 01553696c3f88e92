-- wh_ep_record: what one recorder batch changes for one endpoint, in one call: the attempts'
-- outcomes folded into its health (wh_ep_health.lua), then their records appended to its
-- attempt log (wh_ep_log.lua), each script's logic unchanged.
-- KEYS (one slot {wh:<tenant>}): 1 endpoint hash, 2 its attempt log
-- ARGV: 1 outcomes, comma-separated ('' for none), 2..9 wh_ep_health.lua's ARGV 2..9,
--       10 log maxlen, 11 log ttl ms, 12.. attempt records (JSON), oldest first
-- Returns wh_ep_health.lua's reply, or {'', 0} when there were no outcomes to fold in.
-- Not safe to resend as such (a resend would count the outcomes and log the attempts
-- twice): memoized by the script runner.
--@include wh_ep_health as fold_health
--@include wh_ep_log as append_log

local health = {'', 0}
if ARGV[1] ~= '' then
  health = fold_health({KEYS[1]}, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6],
    ARGV[7], ARGV[8], ARGV[9]})
end
if #ARGV > 11 then
  append_log({KEYS[1], KEYS[2]}, {ARGV[10], ARGV[11], unpack(ARGV, 12)})
end
return health
