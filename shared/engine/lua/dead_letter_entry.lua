-- dead_letter_entry: move a stream entry the worker cannot even parse (missing fields, bad
-- job id, unknown job, other format version) to the dead-letter stream with a reason code,
-- and ack it -- in one step, so it is neither lost nor redelivered forever.
-- KEYS (one slot): 1 work stream, 2 dead-letter stream
-- ARGV: 1 entry_id, 2 group, 3 reason code, 4 detail, 5 dlq_maxlen, 6 stream name,
--       7.. the entry's raw field/value pairs
-- Returns the dead-letter entry id
local fields = {'reason', ARGV[3], 'detail', ARGV[4], 'stream', ARGV[6], 'entry', ARGV[1],
  'at_ms', now_ms()}
for i = 7, #ARGV, 2 do
  fields[#fields + 1] = 'raw_' .. ARGV[i]
  fields[#fields + 1] = ARGV[i + 1] or ''
end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', unpack(fields))
ack(KEYS[1], ARGV[2], ARGV[1])
return id
