-- Create the state if missing and store the policy. ARGV: now, policy_json
-- (runs after the shared health.lua, see __init__.py)
local d, p = h_load(KEYS[1], tonumber(ARGV[1]), ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return h_save(KEYS[1], d, ARGV[2])
