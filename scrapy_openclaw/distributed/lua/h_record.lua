-- ARGV: now, policy_json, success(1/0), latency ('' none), domain signal(1/0), penalty,
--       congestion(2: a 429, whose delivered rate is the limit / 1 / 0), throttle(1/0), retry_after ('' none),
--       jitter factor,
--       answered(1/0), in the 5xx share(1/0), the fit history's note ('a' / 'r' / ''), when it was sent,
--       a rate signal (1/0)
-- KEYS: the domain's hash, the domain index, the domain's history for the limit fit
--       -> {{fields}, the circuit transition this record caused: 'open' | 'closed' | ''}
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local now = tonumber(ARGV[1])
local d, p = h_load(KEYS[1], now, ARGV[2])
local before = d.circuit
if ARGV[3] == '1' then
  h_success(d, p, now, tonumber(ARGV[4]), KEYS[3], tonumber(ARGV[14]))
else
  h_failure(d, p, now, ARGV[11] == '1', ARGV[12] == '1', ARGV[5] == '1', tonumber(ARGV[6]), ARGV[7] ~= '0',
    ARGV[7] == '2', ARGV[8] == '1', tonumber(ARGV[9]), tonumber(ARGV[10]), KEYS[3], ARGV[13], tonumber(ARGV[14]), ARGV[15] == '1')
end
-- the transition this record caused (a worker reports only its own)
local changed = ''
if d.circuit ~= before and d.circuit ~= 'half_open' then changed = d.circuit end
return {h_save(KEYS[1], d, ARGV[2]), changed}
