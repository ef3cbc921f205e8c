-- ARGV: now, policy_json, token(1/0) -> {ok, record}
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local now = tonumber(ARGV[1])
local d, p = h_load(KEYS[1], now, ARGV[2])
local ok = h_acquire(d, p, now, ARGV[3] == '1')
local flat = h_save(KEYS[1], d)
if ok then return {1, flat} end
return {0, flat}
