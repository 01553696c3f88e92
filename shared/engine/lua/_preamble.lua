-- Shared helpers prepended to every script by shared/scripts.py (after the generated
-- ALLOWED transition table). Helpers only touch keys passed to them by the caller, so the
-- one-slot rule of each script is decided by that script's KEYS alone.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function can_move(from, to)
  local row = ALLOWED[from]
  return row ~= nil and row[to] == true
end

-- The job's own event history (what SSE replays): `<job key>:events`, a key derived from the
-- declared job key by a suffix, so it carries the same {pN} tag and lives in the same slot.
local JOB_EVENTS_MAXLEN = 1000
local JOB_EVENTS_TTL_MS = 7 * 24 * 3600 * 1000

-- Append one event (the webhook/SSE payload) to the outbox stream and to the job's history.
-- `extra` is a fragment of JSON object members built by shared/events.py (already escaped),
-- or ''. `known` = {id, tenant, metadata, trace_id} when the caller already read them (the
-- hot paths do, in their first HMGET), and `now` its TIME in ms; both may be nil.
local function emit(events_key, maxlen, job_key, event_id, name, extra, known, now)
  local f = known or redis.call('HMGET', job_key, 'id', 'tenant', 'metadata', 'trace_id')
  local meta = f[3]
  if not meta or meta == '' then meta = '{}' end
  local ts = now and math.floor(now / 1000) or redis.call('TIME')[1]
  local payload = '{"event":"' .. name .. '","id":"' .. event_id .. '","timestamp":' .. ts
    .. ',"data":{"job_id":"' .. f[1] .. '","metadata":' .. meta
  if extra ~= nil and extra ~= '' then payload = payload .. ',' .. extra end
  payload = payload .. '}}'
  redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*',
    'event_id', event_id, 'type', name, 'job_id', f[1], 'tenant', f[2] or '',
    'trace_id', f[4] or '', 'payload', payload)
  local history = job_key .. ':events'
  redis.call('XADD', history, 'MAXLEN', '~', JOB_EVENTS_MAXLEN, '*', 'type', name,
    'payload', payload)
  redis.call('PEXPIRE', history, JOB_EVENTS_TTL_MS)
end

-- Acked entries are deleted at once: XACK alone leaves them in the stream forever.
local function ack(stream, group, entry_id)
  redis.call('XACK', stream, group, entry_id)
  redis.call('XDEL', stream, entry_id)
end

-- Idempotency claims are strings "STATUS job_id"; only the claim's own job may move it.
local function set_claim(claim_key, job_id, status, ttl_ms)
  if claim_key == nil or claim_key == '' then return end
  local cur = redis.call('GET', claim_key)
  if cur and string.sub(cur, -string.len(job_id)) == job_id then
    redis.call('SET', claim_key, status .. ' ' .. job_id, 'PX', ttl_ms)
  end
end

-- The live holder of a claim: {status, job_id}, or nil when the key is free. A FAILED claim
-- counts as free: a failed or canceled job must be re-submittable by the client.
local function claim_holder(claim_key)
  local cur = redis.call('GET', claim_key)
  if cur then
    local sp = string.find(cur, ' ', 1, true)
    local status = string.sub(cur, 1, sp - 1)
    if status ~= 'FAILED' then
      return {status, string.sub(cur, sp + 1)}
    end
  end
  return nil
end

-- Claim `claim_key` for `job_id` (PENDING) unless a live claim exists.
-- Returns nil when claimed, else {status, holder_job_id}.
local function try_claim(claim_key, job_id, ttl_ms)
  local held = claim_holder(claim_key)
  if held then return held end
  redis.call('SET', claim_key, 'PENDING ' .. job_id, 'PX', ttl_ms)
  return nil
end

-- A job hash field that must hold an integer (or be absent): a corrupt one is refused before
-- any write, so a script never half-applies on a record it cannot read.
local function bad_int(value)
  if value == false or value == nil or value == '' then return false end
  local n = tonumber(value)
  return n == nil or n ~= math.floor(n)
end

-- The `{pN}` tag part of a key built by shared/keys.py ('splatq:{p0}:job:...' -> 'splatq:{p0}').
local function key_tag(key)
  return string.sub(key, 1, (string.find(key, '}', 1, true)))
end

-- The fleet clock of a partition (`<tag>:fleet`): when a live worker last reached Redis, and
-- how much time in all nobody could (`outage_ms`). Every worker ticks it several times per
-- lease TTL, and so does every reclaim. A gap longer than `allowance_ms` since the last
-- contact means no worker could reach Redis -- an outage, a stall, a failover (or the whole
-- fleet was down) -- and the whole gap is credited: leases do not lapse for time in which
-- their holders could not possibly renew them. `outage_end_ms` records when the last outage
-- was seen to end (see reclaim.lua). Returns the outage total after this tick.
local function fleet_tick(fleet_key, now, allowance_ms)
  local f = redis.call('HMGET', fleet_key, 'tick_ms', 'outage_ms')
  local last, outage = tonumber(f[1]), tonumber(f[2]) or 0
  if last and now - last > allowance_ms then
    outage = outage + (now - last)
    redis.call('HSET', fleet_key, 'tick_ms', now, 'outage_ms', outage, 'outage_end_ms', now)
  else
    redis.call('HSET', fleet_key, 'tick_ms', now)
  end
  return outage
end

local function fleet_outage(fleet_key)
  return redis.call('HGET', fleet_key, 'outage_ms') or '0'
end

-- Fair scheduling (docs/architecture.md#fair-scheduling): a job admitted under a tenant policy
-- waits in its tenant's own queue, and work is moved into the shared stream -- where the
-- consumer group, leases and the reaper take over -- in deficit round-robin order by
-- estimated cost, and only as workers ask for it, so the ready part of the stream stays short
-- and a tenant's wait does not depend on another tenant's backlog. Per partition and stream,
-- all under the partition's `{pN}` tag (one slot):
--   <tag>:fq:<s>:ring     LIST: tenants with waiting work, in round-robin order
--   <tag>:fq:<s>:q:<t>    LIST: tenant t's waiting jobs, '<job id> <cost>', oldest first
--   <tag>:fq:<s>:waiting  ZSET: every waiting job id -> its enqueue time (ms)
--   <tag>:fq:<s>:state    HASH: d:<t> deficit, r:<t> jobs fed under a cap and unfinished
--                         (running, in the stream, or parked for a retry), w:<t> weight,
--                         c:<t> running cap (0 = none), a:<t> '1' in the ring | 'capped'
-- A fair job's `fq` field says where it stands: '1' waiting, 'c' fed and counted against its
-- tenant's cap, 'f' fed uncounted (no cap); fair_release settles it at the terminal exit.
local function fq_base(tag, stream_name)
  return tag .. ':fq:' .. stream_name
end

-- Append a new job to its tenant's queue; the tenant joins the ring if it was not in it.
-- `weight` and `cap` are the tenant's policy as of this submission.
local function fair_push(tag, stream_name, tenant, job_id, cost, weight, cap, now)
  local base = fq_base(tag, stream_name)
  local state = base .. ':state'
  redis.call('RPUSH', base .. ':q:' .. tenant, job_id .. ' ' .. cost)
  redis.call('ZADD', base .. ':waiting', now, job_id)
  local f = redis.call('HMGET', state, 'a:' .. tenant, 'w:' .. tenant, 'c:' .. tenant,
    'r:' .. tenant)
  if f[2] ~= tostring(weight) or f[3] ~= tostring(cap) then
    redis.call('HSET', state, 'w:' .. tenant, weight, 'c:' .. tenant, cap)
  end
  local active = f[1]
  if active == 'capped' and (cap == 0 or (tonumber(f[4]) or 0) < cap) then
    active = nil  -- its cap was raised: back in line at once
  end
  if not active then
    redis.call('HSET', state, 'a:' .. tenant, '1')
    redis.call('RPUSH', base .. ':ring', tenant)
  end
end

-- Move up to `n` waiting jobs into the stream in deficit round-robin order: a tenant at the
-- head of the ring is served while its deficit covers its next job's cost, else it is
-- credited `quantum` x its weight and goes to the back; a tenant at its running cap leaves
-- the ring until one of its jobs ends. Returns how many were moved.
local function fair_feed(tag, stream_name, stream_key, n, quantum, stream_maxlen)
  if n <= 0 then return 0 end
  local base = fq_base(tag, stream_name)
  local ring = base .. ':ring'
  local len = redis.call('LLEN', ring)
  if len == 0 then return 0 end
  local state = base .. ':state'
  local fed = 0
  -- every turn either moves a job or credits a tenant at least one job's worth (quantum is
  -- the largest cost), so this bound is never what stops a feed that could go on
  local turns = 2 * (n + len) + 8
  while fed < n and turns > 0 do
    turns = turns - 1
    local t = redis.call('LINDEX', ring, 0)
    if not t then break end
    local q = base .. ':q:' .. t
    local head = redis.call('LINDEX', q, 0)
    if not head then
      redis.call('LPOP', ring)
      redis.call('HDEL', state, 'a:' .. t, 'd:' .. t, 'w:' .. t, 'c:' .. t)
    else
      local sp = string.find(head, ' ', 1, true)
      local job_id, cost = string.sub(head, 1, sp - 1), tonumber(string.sub(head, sp + 1))
      local f = redis.call('HMGET', state, 'd:' .. t, 'r:' .. t, 'w:' .. t, 'c:' .. t)
      local deficit, running = tonumber(f[1]) or 0, tonumber(f[2]) or 0
      local cap = tonumber(f[4]) or 0
      if cap > 0 and running >= cap then
        redis.call('LPOP', ring)
        redis.call('HSET', state, 'a:' .. t, 'capped')
        redis.call('HDEL', state, 'd:' .. t)
      elseif deficit < cost then
        redis.call('HSET', state, 'd:' .. t, deficit + quantum * (tonumber(f[3]) or 1))
        redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
      else
        redis.call('LPOP', q)
        -- not in `waiting` any more: canceled while it waited; dropped, nothing charged
        if redis.call('ZREM', base .. ':waiting', job_id) == 1 then
          local job_key = tag .. ':job:' .. job_id
          local jf = redis.call('HMGET', job_key, 'trace_id', 'claim_key')
          local entry_id = redis.call('XADD', stream_key, 'MAXLEN', '~', stream_maxlen, '*',
            'v', '1', 'job', job_id, 'trace', jf[1] or '', 'claim', jf[2] or '')
          if cap > 0 then
            redis.call('HSET', job_key, 'entry_id', entry_id, 'fq', 'c')
            redis.call('HSET', state, 'd:' .. t, deficit - cost, 'r:' .. t, running + 1)
          else
            redis.call('HSET', job_key, 'entry_id', entry_id, 'fq', 'f')
            redis.call('HSET', state, 'd:' .. t, deficit - cost)
          end
          fed = fed + 1
        end
        if redis.call('LLEN', q) == 0 then
          redis.call('LPOP', ring)
          redis.call('HDEL', state, 'a:' .. t, 'd:' .. t, 'w:' .. t, 'c:' .. t)
        end
      end
    end
  end
  return fed
end

-- Keep one entry ready in the stream while work waits in the fair queues: a worker blocked on
-- the stream (XREADGROUP BLOCK: it cannot run the feed) must wake whenever there is work.
-- Called after every enqueue and every take, so the stream's ready part holds at most this
-- one entry beyond what takes asked for; it too is chosen in fair order.
local function fair_keep_one_ready(tag, stream_name, stream_key, group, quantum, stream_maxlen)
  if redis.call('LLEN', fq_base(tag, stream_name) .. ':ring') == 0 then return end
  local pending = redis.pcall('XPENDING', stream_key, group)
  local delivered = type(pending) == 'table' and tonumber(pending[1]) or 0
  if redis.call('XLEN', stream_key) <= delivered then
    fair_feed(tag, stream_name, stream_key, 1, quantum, stream_maxlen)
  end
end

-- A fair job's terminal exit (completed, failed, canceled, dead-lettered), given its `fq`: a
-- waiting job stops counting as waiting; a counted one frees its tenant's running slot --
-- once (the flag goes with it) -- and a tenant parked at its cap rejoins the ring. An
-- uncounted one ('f', the common case) costs nothing here.
local function fair_release(job_key, job_id, tenant, stream_name, fq)
  if fq ~= '1' and fq ~= 'c' then return end
  if redis.call('HDEL', job_key, 'fq') == 0 then return end
  local base = fq_base(key_tag(job_key), stream_name)
  if fq == '1' then
    redis.call('ZREM', base .. ':waiting', job_id)
    return
  end
  local state = base .. ':state'
  local running = redis.call('HINCRBY', state, 'r:' .. tenant, -1)
  if running <= 0 then redis.call('HDEL', state, 'r:' .. tenant) end
  local f = redis.call('HMGET', state, 'a:' .. tenant, 'c:' .. tenant)
  if f[1] == 'capped' then
    local cap = tonumber(f[2]) or 0
    if cap == 0 or running < cap then
      redis.call('HSET', state, 'a:' .. tenant, '1')
      redis.call('RPUSH', base .. ':ring', tenant)
    end
  end
end

-- fair_release for a caller that has not read the job's fields.
local function fair_release_of(job_key)
  local f = redis.call('HMGET', job_key, 'fq', 'id', 'tenant', 'stream')
  if f[1] and f[2] and f[4] then fair_release(job_key, f[2], f[3] or '', f[4], f[1]) end
end

-- A tenant's backlog in one stream of a partition: a sorted set of its unfinished job ids
-- (queued, processing or retrying), scored by enqueue time. enqueue.lua counts it against
-- the tenant's share; every exit to a terminal status removes the job (ZREM: a repeat is
-- harmless). The key hangs under the job key's own `{pN}` tag, so it shares the slot.
local BACKLOG_MAX_AGE_MS = 7 * 24 * 3600 * 1000

local function backlog_key(tag, stream_name, tenant)
  return tag .. ':backlog:' .. stream_name .. ':' .. tenant
end

local function backlog_done(job_key, job_id, tenant, stream_name)
  if job_id == nil then
    local f = redis.call('HMGET', job_key, 'id', 'tenant', 'stream')
    job_id, tenant, stream_name = f[1], f[2], f[3]
  end
  if job_id and stream_name then
    redis.call('ZREM', backlog_key(key_tag(job_key), stream_name, tenant or ''), job_id)
  end
end

local function backlog_add(job_key, now)
  local f = redis.call('HMGET', job_key, 'id', 'tenant', 'stream')
  if f[1] and f[3] then
    redis.call('ZADD', backlog_key(key_tag(job_key), f[3], f[2] or ''), now, f[1])
    redis.call('HSET', job_key, 'backlog_counted', '1')
  end
end

-- Dead-letter a delivered entry whose job record is corrupt: the job fails with a code (when
-- its status allows), the entry moves to the partition's dead-letter stream and is acked.
-- Keys are derived under the job key's own tag (same slot).
local function dead_letter_corrupt(job_key, events_key, stream_key, group, entry_id, detail,
                                   event_id, events_maxlen, failed_name, dlq_maxlen)
  local tag = key_tag(job_key)
  local now = now_ms()
  local f = redis.call('HMGET', job_key, 'id', 'status')
  redis.call('XADD', tag .. ':dlq:jobs', 'MAXLEN', '~', dlq_maxlen, '*', 'job', f[1] or '',
    'entry', entry_id, 'stream', string.match(stream_key, '([^:]+)$'),
    'reason', 'corrupt_job_record', 'detail', detail, 'at_ms', now)
  redis.call('HSET', job_key, 'status', 'failed', 'stage', 'dead_lettered',
    'error_code', 'CORRUPT_JOB_RECORD', 'error_message', detail, 'error_retryable', '0',
    'completed_at_ms', now, 'updated_at_ms', now, 'lease_token', '', 'worker', '')
  backlog_done(job_key)
  fair_release_of(job_key)
  if failed_name and failed_name ~= '' then
    emit(events_key, events_maxlen, job_key, event_id, failed_name,
      '"error_code":"CORRUPT_JOB_RECORD","message":' .. cjson.encode(detail)
      .. ',"retryable":false')
  end
  ack(stream_key, group, entry_id)
end

-- Why a job record cannot be started, or nil: checked before the first write.
local function record_problem(status, attempts, deliveries)
  if ALLOWED[status] == nil then
    return 'unknown status ' .. tostring(status)
  end
  if bad_int(attempts) then return 'non-integer attempts' end
  if bad_int(deliveries) then return 'non-integer deliveries' end
  return nil
end

-- Start one delivered entry: fence it with a lease, move the job to processing, count the
-- delivery and the attempt, append the `started` event. Shared by start.lua (keys declared
-- by the caller) and take.lua (keys derived from the entry under the same {pN} tag).
-- The lease token is written to the job hash too (`lease_token`): that field, not the lease
-- key's TTL, is the fence every later write of this run checks, so a holder whose lease key
-- lapsed while nobody else took the job may renew it and commit (see renew.lua).
-- Returns {'started', flat job hash...} | {'unknown'} | {'skip', status} | {'stale'} |
--         {'busy'} | {'dead_lettered', detail} (a corrupt record, failed and dead-lettered)
local function start_entry(job_key, lease_key, events_key, stream_key, claim_key, group,
                           entry_id, token, ttl_ms, consumer, event_id, events_maxlen,
                           started_name, claim_ttl_ms, failed_name, outage_mark, co_running,
                           dlq_maxlen)
  if redis.call('EXISTS', job_key) == 0 then
    return {'unknown'}
  end
  local st = redis.call('HMGET', job_key, 'status', 'entry_id', 'attempts', 'deliveries', 'id',
    'tenant', 'metadata', 'trace_id')
  local status, entry = st[1], st[2]
  if status == 'completed' or status == 'failed' or status == 'canceled' then
    -- a duplicate delivery of a finished (or canceled-while-queued) job: drop the entry
    ack(stream_key, group, entry_id)
    return {'skip', status}
  end
  if entry ~= entry_id then
    -- an older entry of a job that has since been re-enqueued (retry, redrive)
    ack(stream_key, group, entry_id)
    return {'stale'}
  end
  local problem = record_problem(status, st[3], st[4])
  if problem then
    dead_letter_corrupt(job_key, events_key, stream_key, group, entry_id,
      'unreadable job record: ' .. problem, event_id, events_maxlen, failed_name, dlq_maxlen)
    return {'dead_lettered', problem}
  end
  local holder = redis.call('GET', lease_key)
  if (holder and holder ~= token) or not can_move(status, 'processing') then
    return {'busy'}
  end
  local now = now_ms()
  redis.call('SET', lease_key, token, 'PX', ttl_ms)
  -- The counts were read and checked above: written with the rest in one HSET.
  local attempt = (tonumber(st[3]) or 0) + 1
  redis.call('HSET', job_key, 'status', 'processing', 'stage', 'started', 'worker', consumer,
    'started_at_ms', now, 'updated_at_ms', now, 'lease_until_ms', now + tonumber(ttl_ms),
    'lease_token', token, 'attempts', attempt, 'deliveries', (tonumber(st[4]) or 0) + 1,
    'outage_mark', outage_mark or fleet_outage(key_tag(job_key) .. ':fleet'),
    'co_running', co_running or 1)
  if claim_key then
    set_claim(claim_key, st[5], 'PROCESSING', claim_ttl_ms)
  end
  emit(events_key, events_maxlen, job_key, event_id, started_name, '"attempt":' .. attempt,
    {st[5], st[6], st[7], st[8]}, now)
  local out = redis.call('HGETALL', job_key)
  table.insert(out, 1, 'started')
  return out
end

-- True when `token` is the job's current run: the fence of renew/progress/finish. Every exit
-- from processing clears the token, so a match also means the job is processing (finish
-- still checks the transition table for what the run may do).
local function holds_run(job_key, token)
  return token ~= '' and redis.call('HGET', job_key, 'lease_token') == token
end

