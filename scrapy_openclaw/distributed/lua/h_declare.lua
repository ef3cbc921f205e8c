-- The limit the domain's RateLimit headers declare (HealthRegistry.declare_limit).
-- ARGV: now, policy_json, pace (req/s; 0: none any more) -> record (the stored value, see h_save)
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local now = tonumber(ARGV[1])
local d, p = h_load(KEYS[1], now, ARGV[2])
h_declare(d, p, now, tonumber(ARGV[3]) or 0)
return h_save(KEYS[1], d)
