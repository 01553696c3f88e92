-- finish_batch: many workers' exits from `processing` in one script call -- finish.lua's
-- logic, unchanged, once per job (the lease-token fence, the transition table, the resend
-- answer of `last_commit`): a batch pays the script call once, not once per job.
-- KEYS: every job's finish.lua KEYS, one job after another (all of one partition: one slot)
-- ARGV: 1 the jobs' counts, 'nkeys,nargs;nkeys,nargs;...', then every job's finish.lua ARGV,
--       one job after another
-- Returns one finish.lua reply per job, in order; a job whose finish raised an error answers
-- {'error', message} and the others are still committed.
-- Safe to resend: each job's finish is (`last_commit`).
--@include finish as finish_one

local out = {}
local k, a = 0, 1
for counts in string.gmatch(ARGV[1], '[^;]+') do
  local nk, na = string.match(counts, '^(%d+),(%d+)$')
  nk, na = tonumber(nk), tonumber(na)
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do args[i] = ARGV[a + i] end
  k, a = k + nk, a + na
  out[#out + 1] = batch_member(finish_one, keys, args)
end
return out
