-- advance: a pipeline stage's run succeeded: in one step the stage's ledger record is written,
-- the job leaves `processing` for the next stage's stream (status queued, a fresh attempt and
-- delivery budget there), the stage's entry is acked and a `progress` event goes out (the
-- outbox), with an optional second event (preview_ready). Fenced like finish.lua: a run
-- whose job was taken over advances nothing.
-- KEYS (one slot): 1 job hash, 2 lease, 3 this stage's work stream, 4 events stream,
--                  5 the next stage's work stream
-- ARGV: 1 lease token, 2 entry_id, 3 group, 4 request id, 5 options (JSON):
--       {"stage", "next", "record" (the finished stage's ledger JSON), "progress",
--        "event_id", "event", "extra" (event JSON members), "events_maxlen",
--        "stream_maxlen", "fields" [name, value, ...] (more job fields),
--        "also": optional {"event_id", "event", "extra"} (a second event)}
-- Returns {'ok', next entry id} | {'lease_lost'} | {'cancel_requested'} |
--         {'illegal', status}
-- Safe to resend (a lost reply): `last_commit` = '<request id> advanced' is written with the
-- move, and a resend of that very call answers 'ok' without doing anything again.
local st = redis.call('HMGET', KEYS[1], 'status', 'cancel_requested', 'id', 'last_commit',
  'tenant', 'lease_token', 'metadata', 'trace_id', 'claim_key', 'entry_id', 'watch')
local status, job_id = st[1], st[3]
if not status then
  return {'illegal', 'missing'}
end
local rid = ARGV[4]
if st[4] and st[4] == rid .. ' advanced' then
  return {'ok', st[10] or ''}
end
if ARGV[1] == '' or st[6] ~= ARGV[1] then
  return {'lease_lost'}
end
-- A cancel that arrived while the stage ran wins: the worker commits `canceled` instead.
if st[2] == '1' then
  return {'cancel_requested'}
end
if not can_move(status, 'queued') then
  return {'illegal', status}
end
local o = cjson.decode(ARGV[5])
local now = now_ms()
local entry_id = redis.call('XADD', KEYS[5], 'MAXLEN', '~', o.stream_maxlen, '*',
  'v', '1', 'job', job_id, 'trace', st[8] or '', 'claim', st[9] or '')
local sets = {}
for _, v in ipairs(o.fields or {}) do sets[#sets + 1] = v end
local function put(name, value)
  sets[#sets + 1] = name
  sets[#sets + 1] = value
end
put('status', 'queued'); put('stage', 'queued'); put('current_stage', o.next)
put('ps.' .. o.stage, o.record); put('progress', o.progress)
-- The next stage has its own retry and delivery budget.
put('attempts', 0); put('deliveries', 0); put('delivery_charge', 0); put('lapses', '')
put('lease_until_ms', 0); put('worker', ''); put('lease_token', '')
put('entry_id', entry_id); put('updated_at_ms', now); put('last_commit', rid .. ' advanced')
redis.call('HSET', KEYS[1], unpack(sets))
redis.call('DEL', KEYS[2])
ack(KEYS[3], ARGV[3], ARGV[2])
local known = {job_id, st[5], st[7], st[8], st[11]}
emit(KEYS[4], o.events_maxlen, KEYS[1], o.event_id, o.event, o.extra, known, now)
if o.also then
  emit(KEYS[4], o.events_maxlen, KEYS[1], o.also.event_id, o.also.event, o.also.extra, known,
    now)
end
return {'ok', entry_id}
