-- {ready, delayed, inflight, discovered} of one shard in one round trip. KEYS: the shard's keys.
-- (ready: the priority set holds every ready entry; an earlier version kept a count beside it)
local n = redis.call('ZCARD', KEYS[1])
return {n, redis.call('ZCARD', KEYS[8]), redis.call('ZCARD', KEYS[9]), tonumber(redis.call('GET', KEYS[16]) or '0')}
