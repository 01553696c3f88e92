-- reclaim: decide the fate of one entry the reaper took with XAUTOCLAIM. Idle time alone is
-- not trusted: the job's own lease decides, and a lease does not lapse for time in which no
-- worker could reach Redis (the fleet clock, see fleet_tick in _preamble.lua).
-- KEYS (one slot): 1 job hash, 2 lease, 3 work stream, 4 dead-letter stream, 5 events stream,
--                  6 claim key (optional)
-- ARGV: 1 entry_id, 2 group, 3 max_deliveries, 4 event_id, 5 events_maxlen, 6 dlq_maxlen,
--       7 failed event name, 8 retention_ms, 9 claim_ttl_ms, 10 stream name,
--       11 fleet allowance ms (a gap in contact longer than this is an outage),
--       12 hard cap on deliveries (dead-letters whatever the charge)
--   Also ticks `<tag>:fleet` and reads `<tag>:workers` (the job key's own tag: the same
--   slot).
-- Returns {'take', cause, charge} (this worker now owns it and must start it; cause:
-- 'worker_death' | 'mass_death' | 'stale': an entry whose job was not processing) |
-- {'alive'} (handed back to
-- the lease holder) | {'outage_grace', ms} (the lease key lapsed, but within outage time:
-- handed back to its holder, who renews it) | {'skip', status} | {'stale'} | {'unknown'} |
-- {'dead_lettered', deliveries}
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'unknown'}
end
local now = now_ms()
local outage = fleet_tick(key_tag(KEYS[1]) .. ':fleet', now, tonumber(ARGV[11]))
local st = redis.call('HMGET', KEYS[1], 'status', 'entry_id', 'deliveries', 'worker', 'id',
  'error_code', 'lease_until_ms', 'outage_mark', 'delivery_charge', 'lapses', 'co_running')
local status, entry, worker, job_id = st[1], st[2], st[4], st[5]
-- A corrupt count reads as the limit: such a record is dead-lettered, never crashes a reaper.
local deliveries = tonumber(st[3] or '0') or tonumber(ARGV[3])
if status == 'completed' or status == 'failed' or status == 'canceled' then
  ack(KEYS[3], ARGV[2], ARGV[1])
  return {'skip', status}
end
if entry ~= ARGV[1] then
  ack(KEYS[3], ARGV[2], ARGV[1])
  return {'stale'}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  -- a live lease: the job is healthy; give the entry back to the worker holding it
  if worker and worker ~= '' then
    redis.call('XCLAIM', KEYS[3], ARGV[2], worker, 0, ARGV[1], 'JUSTID')
  end
  return {'alive'}
end
if status == 'processing' and worker and worker ~= '' then
  -- The lease key expired; but time in which nobody could reach Redis does not count
  -- against its holder. Within that credit the holder is presumed alive: it renews (and
  -- re-takes the lease) once it can, and the job is committed once, by the run that ran it.
  local credit = outage - (tonumber(st[8]) or outage)
  local deadline = (tonumber(st[7]) or 0) + credit
  if credit > 0 then
    -- ...and after an outage the holder gets at least a full lease TTL of reachable time to
    -- renew: it is reconnecting (backoff, retries), not dead.
    local ended = tonumber(redis.call('HGET', key_tag(KEYS[1]) .. ':fleet', 'outage_end_ms'))
    if ended then deadline = math.max(deadline, ended + 2 * tonumber(ARGV[11])) end
  end
  if credit > 0 and now < deadline then
    redis.call('XCLAIM', KEYS[3], ARGV[2], worker, 0, ARGV[1], 'JUSTID')
    return {'outage_grace', deadline - now}
  end
end
-- Crash attribution: the lease lapsed while Redis was reachable, so the job's worker died (or
-- stalled past the lease). That is evidence against the job only in part: 1/k when k jobs
-- shared the worker process (`co_running`, kept by start and renew: the process's jobs over
-- all its stage workers, which share one name -- see shared/engine/fleet.py). A job alone in
-- its process at every death -- the poison signal -- is charged in full each time. The limit
-- applies to the charge; the raw delivery count has a hard cap of its own, so nothing cycles
-- forever.
local max_charge = tonumber(ARGV[3])
local charge = tonumber(st[9]) or 0
local lapses = st[10] or ''
-- A mass death -- other workers fell silent in the same period (a node drained, a spot
-- reclaim, the OOM killer taking several pods, a chaos drill) -- is not evidence against this
-- job: it is charged nothing. Every worker process records its last contact in `<tag>:workers`
-- (see fleet_tick.lua), busy or idle: one name per process, so a process's own stage workers
-- never count as others; this job's worker went silent about when its lease was last
-- renewed (`lease_until_ms` - TTL). Another worker counts when it has been silent for half a
-- lease TTL (live ones tick every TTL/6), fell silent within four TTLs of this one, and never ran this job (its name is not in the
-- job's own lapse log): a poison job's deaths are all deaths of workers that ran it, so they
-- never discount each other, and it is charged in full while the fleet around it stays alive.
-- The cost: a poison job that lapses while unrelated workers also die is discounted, and is
-- stopped by the hard cap on deliveries (SPLATQ_MAX_DELIVERIES x 3) instead.
local cause = 'stale'
if status == 'processing' then
  local k = math.max(1, tonumber(st[11]) or 1)
  local ttl = 2 * tonumber(ARGV[11])  -- the allowance is half a lease TTL
  local died = (tonumber(st[7]) or now) - ttl
  local others = 0
  local silent = redis.call('ZRANGEBYSCORE', key_tag(KEYS[1]) .. ':workers',
    died - 4 * ttl, math.min(died + 4 * ttl, now - tonumber(ARGV[11])))
  for _, w in ipairs(silent) do
    if w ~= worker and not string.find(lapses, ' ' .. w .. ' ', 1, true) then
      others = others + 1
    end
  end
  if others > 0 then
    cause = 'mass_death'
    lapses = lapses .. now .. ' ' .. (worker or '?') .. ' ' .. k .. ' mass+' .. others .. ';'
  else
    cause = 'worker_death'
    charge = charge + 1 / k
    lapses = lapses .. now .. ' ' .. (worker or '?') .. ' ' .. k .. ';'
  end
  -- only the last eight deaths are kept
  local _, count = string.gsub(lapses, ';', '')
  while count > 8 do
    lapses = string.sub(lapses, string.find(lapses, ';', 1, true) + 1)
    count = count - 1
  end
end
if (charge >= max_charge - 1e-9 or deliveries >= tonumber(ARGV[12]))
    and can_move(status, 'failed') then
  local msg = string.format('its worker died %d times while running it, charged %.2f of a'
    .. ' limit of %d (a death counts 1/k when k jobs shared the worker); delivered %d times',
    select(2, string.gsub(lapses, ';', '')), charge, max_charge, deliveries)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'job', job_id, 'entry', ARGV[1],
    'stream', ARGV[10], 'reason', 'max_deliveries_exceeded', 'deliveries', deliveries,
    'charge', string.format('%.2f', charge), 'lapses', lapses,
    'last_worker', worker or '', 'last_error', st[6] or '', 'at_ms', now)
  redis.call('HSET', KEYS[1], 'status', 'failed', 'error_code', 'dead_lettered',
    'error_message', msg, 'error_retryable', '0', 'completed_at_ms', now,
    'updated_at_ms', now, 'stage', 'dead_lettered', 'worker', '', 'lease_until_ms', 0,
    'lease_token', '', 'delivery_charge', string.format('%.4f', charge), 'lapses', lapses)
  redis.call('PEXPIRE', KEYS[1], ARGV[8])
  backlog_done(KEYS[1])
  fair_release_of(KEYS[1])
  if KEYS[6] then set_claim(KEYS[6], job_id, 'FAILED', ARGV[9]) end
  emit(KEYS[5], ARGV[5], KEYS[1], ARGV[4], ARGV[7],
    '"error_code":"dead_lettered","message":' .. cjson.encode(msg) .. ',"retryable":false')
  ack(KEYS[3], ARGV[2], ARGV[1])
  return {'dead_lettered', deliveries}
end
if status == 'processing' then
  -- the worker died (or stalled past its lease): the job goes back to queued, and this
  -- reaper's worker, which now owns the entry, starts it again
  redis.call('HSET', KEYS[1], 'status', 'queued', 'stage', 'recovered', 'worker', '',
    'lease_until_ms', 0, 'updated_at_ms', now, 'lease_token', '',
    'delivery_charge', string.format('%.4f', charge), 'lapses', lapses)
  redis.call('HINCRBY', KEYS[1], 'reclaims', 1)
end
return {'take', cause, string.format('%.4f', charge)}
