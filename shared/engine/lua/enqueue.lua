-- enqueue: create a job record, claim its idempotency key, put it in line -- its tenant's fair
-- queue, or straight into its stream -- and append the `queued` event: all or nothing.
-- KEYS (one slot {pN}): 1 job hash, 2 work stream, 3 events stream, 4 claim key (optional)
-- ARGV: 1 job_id, 2 event_id, 3 stream_maxlen, 4 events_maxlen, 5 claim_ttl_ms,
--       6 queued event name, 7 event extra JSON, 8 max backlog of this stream partition
--       (0 = unbounded), 9 max backlog of this tenant in it (0 = unbounded),
--       10 fair-scheduling policy, JSON {"cost", "weight", "cap", "quantum", "group"}, or ''
--       to go straight into the stream in arrival order (see fair_push),
--       11 'join' to only join the job holding the claim key, never create one ('' = create),
--       12.. field/value pairs for the job hash (they include 'tenant' and 'stream')
-- Returns {'created', job_id, entry_id ('' while it waits in a fair queue), the field/value
--         pairs this script added to the record (the caller holds the rest)...} |
--         {'duplicate', job_id, claim_status} | {'not_joined'} (join only, and no live claim) |
--         {'exists', job_id} | {'overloaded', backlog, scope ('tenant' | 'stream')}
local job_id = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {'exists', job_id}
end
if KEYS[4] then
  -- A repeat is answered with its job even when the queue is full.
  local held = claim_holder(KEYS[4])
  if held then
    return {'duplicate', held[2], held[1]}
  end
end
if ARGV[11] == 'join' then
  -- The caller may only join (its quota gate made no reservation, counting on the claim's
  -- job): a claim that ended meanwhile (the job was canceled or failed) creates nothing.
  return {'not_joined'}
end
local fields = {}
local given = {}
for i = 12, #ARGV, 2 do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  given[ARGV[i]] = ARGV[i + 1]
end
local given_n = #fields
local tenant, stream_name = given['tenant'] or '', given['stream'] or ''
local function put(name, value)
  fields[#fields + 1] = name
  fields[#fields + 1] = value
end
local now = now_ms()
local tenant_backlog = backlog_key(key_tag(KEYS[1]), stream_name, tenant)
local max_tenant = tonumber(ARGV[9])
if max_tenant > 0 then
  -- The tenant's own share first: one tenant at its limit is refused alone, and the stream
  -- keeps room for every other tenant.
  redis.call('ZREMRANGEBYSCORE', tenant_backlog, '-inf', now - BACKLOG_MAX_AGE_MS)
  local mine = redis.call('ZCARD', tenant_backlog)
  if mine >= max_tenant then
    return {'overloaded', mine, 'tenant'}
  end
end
local max_backlog = tonumber(ARGV[8])
if max_backlog > 0 then
  -- Acked entries are deleted, so XLEN is exactly the work in the stream (ready, running);
  -- the rest waits in the tenants' fair queues.
  local backlog = redis.call('XLEN', KEYS[2])
    + redis.call('ZCARD', fq_base(key_tag(KEYS[1]), stream_name) .. ':waiting')
  if backlog >= max_backlog then
    return {'overloaded', backlog, 'stream'}
  end
end
if KEYS[4] then
  redis.call('SET', KEYS[4], 'PENDING ' .. job_id, 'PX', ARGV[5])
end
-- The whole record in one HSET (fewer calls inside the script). A new record's defaults are
-- left implicit (JobRecord.from_hash and every script read a missing field as them):
-- attempts, deliveries and progress 0, stage 'queued', updated_at_ms = created_at_ms, no
-- claim key -- 5 to 6 fields (~120 bytes) fewer in every record.
put('id', job_id); put('status', 'queued'); put('created_at_ms', now)
if KEYS[4] then put('claim_key', KEYS[4]) end
-- The tenant's listing index in this partition (GET /v1/jobs; shared/engine/keys.py
-- `tenant_jobs`): job ids scored by creation time, kept for the record retention. Derived
-- under the job key's own {pN} tag, so it shares the slot. Its TTL follows every enqueue;
-- the members past the retention are trimmed at one enqueue in eight (those whose id ends
-- in '0': a ULID's last character carries 3 random bits), not at each: readers skip ids
-- whose record is gone, and at most a few enqueues' worth of them wait for the next trim.
local listed = key_tag(KEYS[1]) .. ':jobs:' .. tenant
redis.call('ZADD', listed, now, job_id)
if string.byte(job_id, -1) == 48 then  -- '0'
  redis.call('ZREMRANGEBYSCORE', listed, '-inf', now - JOB_RETENTION_MS)
end
redis.call('PEXPIRE', listed, JOB_RETENTION_MS)
if max_tenant > 0 then
  -- Counted only when admitted under a tenant bound (the gateway always sets one): a
  -- producer that sets none pays nothing for it, and its jobs do not count against a share.
  redis.call('ZADD', tenant_backlog, now, job_id)
  put('backlog_counted', '1')
end
local entry_id = ''
if ARGV[10] ~= '' then
  local policy = cjson.decode(ARGV[10])
  local tag = key_tag(KEYS[1])
  put('fq', '1'); put('entry_id', ''); put('fq_flow', tenant); put('fq_cost', policy.cost)
  redis.call('HSET', KEYS[1], unpack(fields))
  fair_push(tag, stream_name, tenant, job_id, policy.cost, policy.weight, policy.cap, now)
  -- an idle worker blocked on the stream wakes; under load workers' takes do the moving
  fair_keep_one_ready(tag, stream_name, KEYS[2], policy.group, policy.quantum, ARGV[3], true)
else
  entry_id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*',
    'v', '1', 'job', job_id, 'trace', given['trace_id'] or '', 'claim', KEYS[4] or '')
  put('entry_id', entry_id)
  redis.call('HSET', KEYS[1], unpack(fields))
end
emit(KEYS[3], ARGV[4], KEYS[1], ARGV[2], ARGV[6], ARGV[7],
  {job_id, tenant, given['metadata'], given['trace_id']}, now)
-- Only what this script assigned comes back (the producer sent the rest): the record is
-- not read back nor shipped whole.
local out = {'created', job_id, entry_id}
for i = given_n + 1, #fields do out[#out + 1] = fields[i] end
return out
