-- Domains of the shard's index made ready sooner than the pop parked them for (an operator's
-- release, refusals found pace-independent, a higher declared limit: see
-- RedisHealthRegistry._wake). ARGV: now, domains... Each one parked until later is due now
-- (its next pop judges its token); one not in the index is left out. -> how many moved
-- (runs after the shared queue.lua, see __init__.py)
local args = {'XX', 'LT', 'CH'}
for i = 2, #ARGV do
  table.insert(args, ARGV[1])
  table.insert(args, ARGV[i])
end
return redis.call('ZADD', DOMS, unpack(args))
