-- wh_claim_due: claim up to N of a partition's due messages, each for one delivery attempt,
-- in one call; the caller read the candidates from the due set just before (ZRANGEBYSCORE)
-- and names their hashes in KEYS. A claimed message's due time moves past the attempt
-- timeout (a visibility timeout): a dispatcher killed mid-attempt leaves it due again
-- afterwards, so it is delivered at least once. A candidate no longer due (another
-- dispatcher claimed it meanwhile) is left alone; one whose message is no longer pending
-- (recorded meanwhile, or expired) leaves the due set unclaimed.
-- KEYS (one slot {pN}): 1 due zset (`<tag>:wh:due`), 2 this call's replay memo, 3.. the
--   candidates' message hashes, in ARGV's order. Declared, not built here: while the slot
--   migrates (Redis Cluster resharding) a hash already moved makes Redis refuse the call
--   (TRYAGAIN, retried by the delivery loop) instead of the script reading it as gone and
--   dropping a pending message from the due set.
-- ARGV: 1 visibility ms, 2 memo TTL ms, 3.. the candidates' message ids
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
local key_of = {}
for i = 3, #ARGV do key_of[ARGV[i]] = KEYS[i] end
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
    local f = redis.call('HMGET', key_of[id], 'status', unpack(FIELDS))
    if f[2] then answer(out, id, f, tonumber(attempts)) end  -- else gone (expired)
  end
  return out
end

local now = now_ms()
local until_ms = now + tonumber(ARGV[1])
local memo = {}
for i = 3, #ARGV do
  local id, key = ARGV[i], KEYS[i]
  local score = tonumber(redis.call('ZSCORE', KEYS[1], id))
  if score and score <= now then
    -- The status and the fields to send in one read: a claimed message's fields do not
    -- change (fan-out writes them once), so reading them before the claim's writes is the same.
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
end
if #memo > 0 then
  redis.call('SET', KEYS[2], table.concat(memo), 'PX', ARGV[2])
end
return out
