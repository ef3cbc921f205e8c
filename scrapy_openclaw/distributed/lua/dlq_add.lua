-- Adds a dead letter once: a retried XADD after a lost reply must not duplicate it.
-- KEYS: stream, <stream>:ids. ARGV: record id, record data -> 1 added, 0 already there
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
local sid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'data', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], sid)
return 1
