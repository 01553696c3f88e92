-- task_renew: the holder of a task run renews its lock and, optionally, saves its checkpoint
-- (the position of the last finished batch) -- only while the run's fence is the task's. A
-- lock that lapsed while nobody claimed the task (a stall longer than the TTL) is taken back:
-- the fence in the state, not the key's TTL, says whose run it is.
-- KEYS (one slot {task:<name>}): 1 lock, 2 state hash
-- ARGV: 1 token, 2 fence, 3 lock ttl ms, 4 write checkpoint ('1'|'0'), 5 checkpoint
-- Returns 1 (still the holder) | 0 (the run was taken over: stop, write nothing more)
local held = redis.call('GET', KEYS[1])
if held ~= ARGV[1] then
  if held or redis.call('HGET', KEYS[2], 'fence') ~= ARGV[2] then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'checkpoint', ARGV[5])
end
return 1
