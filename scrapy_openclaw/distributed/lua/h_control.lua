-- Operator overrides (HealthRegistry.control). ARGV: now, policy_json, then name/value pairs
-- of ctl_hold, ctl_rate, ctl_concurrency, ctl_down -> record. Ending a give-up forgives the
-- outage so far (down_since = now).
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local now = tonumber(ARGV[1])
local d, p = h_load(KEYS[1], now, ARGV[2])
for i = 3, #ARGV - 1, 2 do d[ARGV[i]] = tonumber(ARGV[i + 1]) end
for i = 3, #ARGV - 1, 2 do
  if ARGV[i] == 'ctl_down' and tonumber(ARGV[i + 1]) == 0 and d.down_since ~= 0 then d.down_since = now end
end
return h_save(KEYS[1], d)
