-- Releases a scheduler window's lock if this token still holds it (compare-and-delete),
-- leaving the done marker when the run finished.
-- KEYS: lock, done marker. ARGV: token, finished ('1'/'0'), done ttl (ms) -> 1 released, 0 lost
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3]) end
redis.call('DEL', KEYS[1])
return 1
