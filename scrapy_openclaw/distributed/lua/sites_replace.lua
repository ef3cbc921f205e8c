-- Replaces a site-memory entry if it is still the one the worker read (compare-and-set on its
-- seal), so two workers saving one domain at once cannot lose each other's counts.
-- KEYS: the domain's hash. ARGV: the seal read ('' = no entry), entry, seal, ttl (s) -> 1 written, 0 changed since
local current = redis.call('HGET', KEYS[1], 'mac') or ''
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'entry', ARGV[2], 'mac', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
