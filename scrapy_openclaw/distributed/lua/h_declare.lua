-- What the domain's RateLimit headers declare (HealthRegistry.declare_limit). ARGV: now,
-- policy_json, pace (req/s; 0: none any more; '': not said), hold_until (0: quota left) -> {fields}
-- (runs after the shared health.lua, see __init__.py)
redis.call('SADD', KEYS[2], ARGV[#ARGV])  -- the domain index (last ARGV: the domain)
local now = tonumber(ARGV[1])
local d, p = h_load(KEYS[1], now, ARGV[2])
local pace, hold_until = tonumber(ARGV[3]), tonumber(ARGV[4]) or 0
if pace then h_declare(d, p, now, pace) end
if hold_until > now then
  if d.declared <= 0 then h_decrease(d, p, now, true, false, nil, nil) end
  d.hold_until = math.max(d.hold_until, hold_until)
end
return h_save(KEYS[1], d, ARGV[2])
