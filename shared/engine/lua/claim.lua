-- claim: take an idempotency claim (status PENDING) on a logical key unless a live claim
-- exists; the SET NX of the design, extended so FAILED claims can be taken again.
-- KEYS (one slot): 1 claim key
-- ARGV: 1 job_id, 2 ttl_ms
-- Returns {1, 'PENDING', job_id} when won | {0, status, holder_job_id}
local held = try_claim(KEYS[1], ARGV[1], ARGV[2])
if held then
  return {0, held[1], held[2]}
end
return {1, 'PENDING', ARGV[1]}
