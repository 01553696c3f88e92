-- fleet_tick: a live worker reached Redis now (see fleet_tick in _preamble.lua). Every worker
-- calls it per partition several times per lease TTL, busy or idle.
-- KEYS (one slot): 1 the partition's fleet clock hash
-- ARGV: 1 allowance ms (a gap in contact longer than this is counted as an outage)
-- Returns the partition's outage total in ms.
return fleet_tick(KEYS[1], now_ms(), tonumber(ARGV[1]))
