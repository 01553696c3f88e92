-- wh_ep_gate: may messages to this endpoint be sent now? Reads what signing needs and
-- applies the circuit breaker: closed -> send them all; open -> defer until it may be
-- probed; open and past its time -> half-open: the first message is the one probe, the
-- others defer until the probe's result is in (or its holder is presumed dead). One call
-- gates every message of a claim batch for this endpoint.
-- A peek (ARGV[3] = '1', sent beside the claim, before its messages are known to be ours)
-- writes nothing: where the gate would take the half-open probe it answers {'ask'}, and the
-- dispatcher gates those messages again once claimed; every other verdict is the gate's own.
-- KEYS (one slot {wh:<tenant>}): 1 endpoint hash
-- ARGV: 1 probe hold ms, 2 half-open deferral ms, 3 '1' to peek (optional)
-- Returns {verdict of the first message, verdict of the others, url, secret,
--          previous secret or '', defer until ms (or 0), disabled reason (or ''),
--          custom headers JSON (or '')}
--   verdicts: 'send' | 'probe' | 'defer' | 'disabled' | 'gone'
local now = now_ms()
local peek = ARGV[3] == '1'
local f = redis.call('HMGET', KEYS[1], 'url', 'secret', 'previous_secret',
  'previous_expires_ms', 'disabled_at_ms', 'disabled_reason', 'circuit', 'open_until_ms',
  'probe_until_ms', 'headers')
local headers = f[10] or ''
if not f[1] then
  return {'gone', 'gone', '', '', '', '0', ''}
end
if f[5] then
  return {'disabled', 'disabled', f[1], '', '', '0', f[6] or ''}
end
local previous = ''
if f[3] and tonumber(f[4] or '0') > now then
  previous = f[3]
end
local wait = tostring(now + tonumber(ARGV[2]))
local circuit = f[7] or 'closed'
if circuit == 'open' then
  local open_until = tonumber(f[8] or '0')
  if open_until > now then
    return {'defer', 'defer', f[1], '', '', tostring(open_until), ''}
  end
  if peek then
    return {'ask'}
  end
  redis.call('HSET', KEYS[1], 'circuit', 'half_open', 'probe_until_ms', now + tonumber(ARGV[1]))
  return {'probe', 'defer', f[1], f[2], previous, wait, '', headers}
end
if circuit == 'half_open' then
  if tonumber(f[9] or '0') > now then
    return {'defer', 'defer', f[1], '', '', wait, ''}
  end
  if peek then
    return {'ask'}
  end
  redis.call('HSET', KEYS[1], 'probe_until_ms', now + tonumber(ARGV[1]))
  return {'probe', 'defer', f[1], f[2], previous, wait, '', headers}
end
return {'send', 'send', f[1], f[2], previous, '0', '', headers}
