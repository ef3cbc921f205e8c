-- {ready, delayed, inflight, discovered} of one shard in one round trip. KEYS: the shard's keys.
local n = tonumber(redis.call('GET', KEYS[7]) or '0')
return {n, redis.call('ZCARD', KEYS[8]), redis.call('ZCARD', KEYS[9]), tonumber(redis.call('GET', KEYS[16]) or '0')}
