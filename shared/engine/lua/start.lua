-- start: a worker takes one delivered entry (a blocking read's or the reaper's); see
-- start_entry in _preamble.lua for what starting means.
-- KEYS (one slot): 1 job hash, 2 lease, 3 events stream, 4 work stream, 5 claim key (optional)
-- ARGV: 1 lease token, 2 ttl_ms, 3 consumer, 4 entry_id, 5 group, 6 event_id,
--       7 events_maxlen, 8 started event name, 9 claim_ttl_ms, 10 failed event name,
--       11 jobs running in this worker's process once these start, 12 dlq_maxlen, 13 the
--       pipeline stage this worker runs ('' or absent = whole jobs)
-- Returns {'started'} (the caller reads the record: Runs.read_started) | {'unknown'} |
--         {'skip', status} | {'stale'} | {'busy'} | {'dead_lettered', detail}
return start_entry(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[5], ARGV[4], ARGV[1],
  ARGV[2], ARGV[3], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], nil, ARGV[11],
  ARGV[12], ARGV[13])
