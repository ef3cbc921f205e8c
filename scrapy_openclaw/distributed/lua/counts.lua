-- {ready, delayed, inflight, discovered} of each shard whose keys are given, in one round trip:
-- KEYS are groups of four (the shard's q, delayed, inflight and found keys, rounds.COUNTED), one
-- group per shard (on one Redis every shard in one call; on a cluster a call per shard, its slot).
-- (ready: the priority set holds every ready entry; an earlier version kept a count beside it)
local out = {}
for i = 1, #KEYS, 4 do
  out[#out + 1] = {redis.call('ZCARD', KEYS[i]), redis.call('ZCARD', KEYS[i + 1]), redis.call('ZCARD', KEYS[i + 2]),
    tonumber(redis.call('GET', KEYS[i + 3]) or '0')}
end
return out
