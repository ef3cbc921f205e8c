-- Extend this worker's leases and requeue everyone's expired ones.
-- ARGV: boost, worker, now, lease_until, id1, ... -> {extended, requeued}
-- (runs after the shared queue.lua, see __init__.py)
local worker = ARGV[2]
local n = 0
for i = 5, #ARGV do
  if redis.call('HGET', OWNER, ARGV[i]) == worker then
    redis.call('ZADD', INFL, 'XX', ARGV[4], ARGV[i])
    n = n + 1
  end
end
return {n, maintain(tonumber(ARGV[3]), 1000, tonumber(ARGV[1]))}
