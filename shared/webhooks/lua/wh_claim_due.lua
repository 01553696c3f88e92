-- wh_claim_due: find the partition's due messages and claim up to ARGV[1] of them, each for
-- one delivery attempt, in one call. A claimed message's due time moves past the attempt
-- timeout (a visibility timeout): a dispatcher killed mid-attempt leaves it due again
-- afterwards, so it is delivered at least once. A member whose message is no longer pending
-- (recorded meanwhile, or expired) leaves the due set unclaimed.
-- KEYS (one slot {pN}): 1 due zset (`<tag>:wh:due`), 2 this call's replay memo.
--   Also touches each claimed message's hash `<tag>:wh:msg:<id>`, built here from KEYS[1]
--   (its `due` suffix replaced by `msg:<id>`, as shared/engine/keys.py names it): the same
--   {pN} tag, so the same slot (Redis Cluster allows a script undeclared keys of its own slot).
-- ARGV: 1 most messages to claim, 2 visibility ms, 3 memo TTL ms
-- Returns a flat array, 9 items per claimed message: id, event_id, event_type, job_id,
--   tenant, url, payload, target, attempts (after this claim) -- what the dispatcher sends,
--   not the whole hash.
-- Safe to resend (a lost reply): its own compact replay memo (KEYS[2]) records the ids and
-- attempt numbers this call claimed -- not the payloads -- and a resend rebuilds the same
-- reply from them, re-reading each message's fields (unchanged while it is claimed: a
-- message is written by its claimer's result, or by fan-out before it was ever due). So a
-- resend claims nothing more and counts no attempt twice. A resend later than the visibility
-- timeout (redis-py's retries come within about a second; the memo lives the runner's replay
-- TTL) could hand out messages another dispatcher has claimed again meanwhile: the duplicate
-- attempt that a visibility timeout always allows (at-least-once; the first final result
-- wins in wh_result.lua).
local base = string.sub(KEYS[1], 1, -4) .. 'msg:'
local FIELDS = {'event_id', 'event_type', 'job_id', 'tenant', 'url', 'payload', 'target'}

-- Appends one message's 9 reply items, from `f` = HMGET of 'status' then FIELDS.
local function answer(out, id, f, attempts)
  out[#out + 1] = id
  for i = 2, 8 do out[#out + 1] = f[i] or '' end
  out[#out + 1] = attempts
end

local out = {}
local prior = redis.call('GET', KEYS[2])
if prior then
  for id, attempts in string.gmatch(prior, '([^\n]*) (%d+)\n') do
    local f = redis.call('HMGET', base .. id, 'status', unpack(FIELDS))
    if f[2] then answer(out, id, f, tonumber(attempts)) end  -- else gone (expired)
  end
  return out
end

local now = now_ms()
local until_ms = now + tonumber(ARGV[2])
local memo = {}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(due) do
  local key = base .. id
  -- The status and the fields to send in one read: a claimed message's fields do not change
  -- (fan-out writes them once), so reading them before the claim's writes is the same.
  local f = redis.call('HMGET', key, 'status', unpack(FIELDS))
  if f[1] ~= 'pending' then
    redis.call('ZREM', KEYS[1], id)
  else
    redis.call('ZADD', KEYS[1], until_ms, id)
    local attempts = redis.call('HINCRBY', key, 'attempts', 1)
    answer(out, id, f, attempts)
    memo[#memo + 1] = id .. ' ' .. attempts .. '\n'
  end
end
if #memo > 0 then
  redis.call('SET', KEYS[2], table.concat(memo), 'PX', ARGV[3])
end
return out
