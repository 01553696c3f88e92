-- history: a job's events after a point, for SSE and `Prefer: wait` (shared/engine/history.py
-- rebuilds each payload). When there are none and the caller will block, it also registers
-- the caller as a watcher -- the record's `watch` field, until when (ms), which `emit` reads
-- to wake watchers -- and answers the wake stream's last id, so the caller's blocking read
-- (XREAD on KEYS[3] after that id) cannot miss an event appended after this call.
-- KEYS (one slot {pN}): 1 job hash, 2 its history list, 3 its wake stream, 4 the history
--   stream releases before the list kept (`<job key>:events`; read until it expires)
-- ARGV: 1 after: ms part, 2 after: sequence part, 3 watch for this many ms when nothing is
--   new (0 = do not), 4 at most this many events
-- Returns {} when the job does not exist, else {job id, metadata, wake id ('' when not
--   watching), items...}: an item is {id, compact item} from the list, or
--   {id, type, payload} from the legacy stream.
-- Safe to resend: a resend reads again and moves `watch` a little later at most.
local f = redis.call('HMGET', KEYS[1], 'id', 'metadata', 'watch')
if not f[1] then return {} end
local after_ms, after_seq = tonumber(ARGV[1]), tonumber(ARGV[2])
local limit = tonumber(ARGV[4])
local out = {f[1], f[2] or '', ''}
local function later(ms, seq)
  return ms > after_ms or (ms == after_ms and seq > after_seq)
end
-- Events of a release before the list: a stream, ids of its own, all older than the list's.
for _, e in ipairs(redis.call('XRANGE', KEYS[4], '(' .. ARGV[1] .. '-' .. ARGV[2], '+',
    'COUNT', limit)) do
  local fields = {}
  for i = 1, #e[2], 2 do fields[e[2][i]] = e[2][i + 1] end
  out[#out + 1] = {e[1], fields['type'] or '', fields['payload'] or ''}
end
-- The list: positions are sequence numbers, so a resume from one of its own ids starts there.
local first = 0
if after_seq > 0 then
  local at = redis.call('LINDEX', KEYS[2], after_seq - 1)
  if at and tonumber(string.match(at, '^(%d+)')) == after_ms then first = after_seq end
end
-- (Unverified, the whole list is read and compared: it is bounded, see JOB_HISTORY_MAX.)
local items = redis.call('LRANGE', KEYS[2], first, first > 0 and first + limit - 1 or -1)
for i, item in ipairs(items) do
  if #out - 3 >= limit then break end
  local seq = first + i
  local ms = tonumber(string.match(item, '^(%d+)'))
  -- After one of the list's own ids every later position is later; otherwise (a legacy id,
  -- an id of a list since expired) compare (ms, seq).
  if ms and (first > 0 or later(ms, seq)) then
    out[#out + 1] = {ms .. '-' .. seq, item}
  end
end
if #out == 3 and tonumber(ARGV[3]) > 0 then
  local now = now_ms()
  local until_ms = now + tonumber(ARGV[3])
  if (tonumber(f[3] or '') or 0) < until_ms then
    redis.call('HSET', KEYS[1], 'watch', until_ms)
  end
  local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
  out[3] = last[1] and last[1][1] or '0-0'
end
return out
