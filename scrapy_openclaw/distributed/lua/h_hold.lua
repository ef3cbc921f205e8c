-- Holds only ever extend. ARGV: now, policy_json, until -> record (the stored value, see h_save)
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local d, p = h_load(KEYS[1], tonumber(ARGV[1]), ARGV[2])
d.hold_until = math.max(d.hold_until, tonumber(ARGV[3]))
return h_save(KEYS[1], d)
