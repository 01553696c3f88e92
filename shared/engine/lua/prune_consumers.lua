-- prune_consumers: delete consumers left by dead workers -- only those with no pending
-- entries and idle for at least ARGV[2] ms. Done in a script because DELCONSUMER drops a
-- consumer's pending entries: the check and the delete must not be separated by a read.
-- KEYS (one slot): 1 work stream
-- ARGV: 1 group, 2 min idle ms, 3 consumer never to delete (the parking consumer)
-- Returns the number of consumers deleted
local removed = 0
local consumers = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['name'] ~= ARGV[3] and tonumber(info['pending']) == 0
      and tonumber(info['idle']) >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed = removed + 1
  end
end
return removed
