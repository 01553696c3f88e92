-- dlq_note: record what was decided about one dead-letter entry in its subject's audit trail
-- (a job's `<job key>:audit`, a webhook message's `<message key>:audit`), and for a purge
-- delete the entry (and its webhook index member) in the same step. Used by the redriver for
-- what it holds or defers, and by `splatq dlq purge` (a person).
-- KEYS (one slot {pN}): 1 dead-letter stream, 2 audit stream, 3 webhook dead-letter index
--       (optional: webhook entries)
-- ARGV: 1 entry id, 2 purge ('1'|'0'), 3 audit record (JSON array of field, value pairs),
--       4 audit ttl ms, 5 index member (with KEYS[3])
-- Returns 'purged' | 'noted' | 'gone' (no such entry: nothing written)
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return 'gone'
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100, '*', 'at_ms', now_ms(), 'entry', ARGV[1],
  unpack(cjson.decode(ARGV[3])))
redis.call('PEXPIRE', KEYS[2], ARGV[4])
if ARGV[2] == '1' then
  redis.call('XDEL', KEYS[1], ARGV[1])
  if KEYS[3] then redis.call('ZREM', KEYS[3], ARGV[5]) end
  return 'purged'
end
return 'noted'
