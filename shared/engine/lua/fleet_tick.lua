-- fleet_tick: a live worker process reached Redis now (see fleet_tick in _preamble.lua). Every
-- worker process calls it per partition several times per lease TTL, busy or idle -- once for
-- all its stage workers, under the name they share (shared/engine/fleet.py).
-- KEYS (one slot): 1 the partition's fleet clock hash
-- ARGV: 1 allowance ms (a gap in contact longer than this is counted as an outage),
--       2 the worker's consumer name (optional)
--   With a name, also records the worker's last contact in `<tag>:workers` (the fleet clock's
--   own tag: the same slot), where reclaim.lua finds the workers that fell silent at the same
--   time as a dead job's worker -- idle ones included.
-- Returns the partition's outage total in ms.
local now = now_ms()
local outage = fleet_tick(KEYS[1], now, tonumber(ARGV[1]))
if ARGV[2] and ARGV[2] ~= '' then
  local workers = key_tag(KEYS[1]) .. ':workers'
  redis.call('ZADD', workers, now, ARGV[2])
  -- a worker silent for ten minutes is forgotten (restarted workers take new names)
  redis.call('ZREMRANGEBYSCORE', workers, '-inf', now - 600000)
  redis.call('PEXPIRE', workers, 600000)
end
return outage
