-- take: read new entries for the free slots of a worker and start them, in one round trip.
-- Phase 1 reads each stream up to its unused reservation; phase 2 offers the slots still idle
-- to interactive first, then synthesis (the weighted slot pool of shared/slots.py).
-- KEYS (one slot {pN}): 1 interactive stream, 2 synthesis stream, 3 events stream, 4 this
--   call's replay memo.
--   Also touches, per entry, `<tag>:job:<id>`, `<tag>:lease:<id>` and the entry's claim key:
--   built here under the same {pN} tag as KEYS, so the same slot (Redis Cluster allows a
--   script undeclared keys of its own slot).
-- ARGV: 1 the options (JSON, one bundle, see Runs.take): {"group", "consumer",
--       "own_interactive", "own_synthesis" (each class's own unused reservation), "idle" (the
--       idle slots), "ttl_ms" (the lease), "nonce" (of this call's lease tokens),
--       "events_maxlen", "started" and "failed" (event names), "claim_ttl_ms", "tag" (the
--       partition's key tag, 'splatq:{p0}'), "event_id_base", "format" (the job format
--       version), "memo_ttl_ms", "running" (jobs already running in this worker's process),
--       "dlq_maxlen", "quantum" (the fair-scheduling quantum: the largest job cost),
--       "stream_maxlen", "fair" (true: feed from the tenants' fair queues -- the entry stage;
--       false: a later pipeline stage, whose streams advance.lua fills), "downstream" (the next
--       stage's stream key without the class, '<tag>:stream:reconstruct:', or '' for none),
--       "bound" (per class, on this stage's running entries plus those waiting undelivered in
--       the next stage's stream, past which this stage takes no more; 0 = none), "stage" (the
--       pipeline stage this worker runs, '' = whole jobs: written as `current_stage`)}
-- Before each read, as many jobs as it asks for are moved from the tenants' fair queues
-- into the stream (fair_feed), so what it reads next is in fair order; after the reads, one
-- more is made ready when work still waits (fair_keep_one_ready).
-- Backpressure between pipeline stages: a stage takes no more of a class than the next
-- stage's stream of that class has room for, so work waits in the tenants' fair queues (in
-- fair order) rather than in a long first-come line further down the pipeline.
-- Returns a list of {stream name, entry id, outcome, payload}: outcome 'started' (payload =
-- {job id}: the caller reads the started records itself, see start_entry), 'raw' (payload =
-- the entry's flat fields; the worker validates and dead-letters it), 'dead_lettered'
-- (payload = {why}: a corrupt job record, failed and dead-lettered here), or
-- skip/stale/busy (payload empty); and, entry id '', 'held' for a class whose read the
-- backpressure bound cut short or 'drained' for one whose last read came back short.
-- Safe to resend (a lost reply): its own replay memo (KEYS[4]) is the reply itself (entry ids
-- and outcomes; no job record is in it), and a resend answers it again.
local o = cjson.decode(ARGV[1])
local group, consumer, tag = o.group, o.consumer, o.tag
local out = {}
local memo = {}
local seq = 0

-- The fleet's outage total as of these starts (read once for the batch; see fleet_tick).
local outage_mark = fleet_outage(tag .. ':fleet')

local prior = redis.call('GET', KEYS[4])
if prior then
  return cjson.decode(prior)
end

-- Phase one reads; phase two starts what was read, so every start knows how many jobs the
-- worker's process will run at once (`co_running`: a death is charged 1/k to each of them).
local read = {}

local fair = o.fair
local downstream, bound = o.downstream, o.bound

local held, room, drained = {}, {}, {}

local function pending_count(key)
  local p = redis.pcall('XPENDING', key, group)
  return type(p) == 'table' and tonumber(p[1]) or 0
end

-- Room of a class: `bound` less the entries waiting (undelivered) in the next stage's stream
-- and this stage's running ones (they go there next); computed once per call.
local function room_for(stream_key, stream_name)
  if room[stream_name] == nil then
    local next_key = downstream .. stream_name
    local waiting_next = redis.call('XLEN', next_key) - pending_count(next_key)
    room[stream_name] = bound - waiting_next - pending_count(stream_key)
  end
  return room[stream_name]
end

local function take_from(stream_key, stream_name, n)
  if bound > 0 and downstream ~= '' and n > 0 then
    local r = room_for(stream_key, stream_name)
    if r < n then
      held[stream_name] = true
      n = r
    end
  end
  if n <= 0 then return 0 end
  if fair then fair_feed(tag, stream_name, stream_key, n, o.quantum, o.stream_maxlen) end
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n,
    'STREAMS', stream_key, '>')
  if not reply then
    drained[stream_name] = true
    return 0
  end
  local entries = reply[1][2]
  drained[stream_name] = #entries < n or nil
  if room[stream_name] ~= nil then room[stream_name] = room[stream_name] - #entries end
  for _, e in ipairs(entries) do
    read[#read + 1] = {stream_key, stream_name, e[1], e[2]}
  end
  return #entries
end

local got = take_from(KEYS[1], 'interactive', o.own_interactive)
got = got + take_from(KEYS[2], 'synthesis', o.own_synthesis)
local idle = o.idle - got
if idle > 0 then
  idle = idle - take_from(KEYS[1], 'interactive', idle)
  take_from(KEYS[2], 'synthesis', idle)
end

if fair then
  fair_keep_one_ready(tag, 'interactive', KEYS[1], group, o.quantum, o.stream_maxlen)
  fair_keep_one_ready(tag, 'synthesis', KEYS[2], group, o.quantum, o.stream_maxlen)
end

local co_running = o.running + #read
for _, r in ipairs(read) do
  local stream_key, stream_name, entry_id, fields = r[1], r[2], r[3], r[4]
  local f = {}
  for i = 1, #fields, 2 do f[fields[i]] = fields[i + 1] end
  local job = f['job']
  local started = nil
  if job and f['v'] == o.format and string.find(job, '^job_%d%d%d[0-9A-Z]+$') then
    local claim = f['claim']
    if not claim or string.sub(claim, 1, #tag + 6) ~= tag .. ':idem:' then claim = nil end
    seq = seq + 1
    started = start_entry(tag .. ':job:' .. job, tag .. ':lease:' .. job, KEYS[3],
      stream_key, claim, group, entry_id, o.nonce .. entry_id, o.ttl_ms, consumer,
      o.event_id_base .. seq, o.events_maxlen, o.started, o.claim_ttl_ms, o.failed,
      outage_mark, co_running, o.dlq_maxlen, o.stage)
  end
  if started == nil or started[1] == 'unknown' then
    out[#out + 1] = {stream_name, entry_id, 'raw', fields}
    memo[#memo + 1] = out[#out]
  else
    local outcome = table.remove(started, 1)
    if outcome == 'started' then started = {job} end
    out[#out + 1] = {stream_name, entry_id, outcome, started}
    memo[#memo + 1] = out[#out]
  end
end
-- Classes the backpressure bound cut short: the worker polls for room instead of blocking
-- on the stream (a blocking read would take past the bound). Classes whose last read came
-- back short ('drained': nothing more was ready): the worker does not take again at once for
-- their free slots. Not memoized: a resend may omit them (the worker then takes again).
for _, name in ipairs({'interactive', 'synthesis'}) do
  if held[name] then
    out[#out + 1] = {name, '', 'held', {}}
  elseif drained[name] then
    out[#out + 1] = {name, '', 'drained', {}}
  end
end
if #memo > 0 then
  redis.call('SET', KEYS[4], cjson.encode(memo), 'PX', o.memo_ttl_ms)
end
return out
