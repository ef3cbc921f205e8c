-- Takes a scheduler window's lock unless the window is done.
-- KEYS: lock, done marker. ARGV: token, ttl (ms) -> 1 taken, 0 not
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
