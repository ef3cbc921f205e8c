-- Extends a scheduler window's lock if this token still holds it.
-- KEYS: lock. ARGV: token, ttl (ms) -> 1 extended, 0 lost
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
