-- Replaces a dead letter in place (same record id; the entry moves to the stream's end).
-- KEYS: stream, <stream>:ids. ARGV: record id, record data -> 1 replaced, 0 unknown id
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then return 0 end
redis.call('XDEL', KEYS[1], old)
local sid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'data', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], sid)
return 1
