-- ARGV: one or more records of the domain, 16 values each: now, policy_json, success(1/0),
--       latency ('' none), domain signal(1/0), penalty,
--       congestion(2: a 429, whose delivered rate is the limit / 1 / 0), throttle(1/0), retry_after ('' none),
--       jitter factor,
--       answered(1/0), in the 5xx share(1/0), the fit history's note ('a' / 'r' / ''), when it was sent,
--       a rate signal (1/0)
--       the domain. Several records (a round's, in order) cost one read and one write.
-- KEYS: the domain's hash, the domain index, the domain's history for the limit fit
--       -> {record, the circuit transition these records caused: 'open' | 'closed' | ''}
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local d, p, before, policy = nil, nil, nil, nil
for base = 0, #ARGV - 16, 16 do
  local function A(i) return ARGV[base + i] end
  local now = tonumber(A(1))
  if d == nil or A(2) ~= policy then  -- (another policy: written, and read again)
    if d ~= nil then h_save(KEYS[1], d) end
    policy = A(2)
    d, p = h_load(KEYS[1], now, policy)
    if before == nil then before = d.circuit end
  else
    h_advance(d, p, now)
  end
  if A(3) == '1' then
    h_success(d, p, now, tonumber(A(4)), KEYS[3], tonumber(A(14)))
  else
    h_failure(d, p, now, A(11) == '1', A(12) == '1', A(5) == '1', tonumber(A(6)), A(7) ~= '0',
      A(7) == '2', A(8) == '1', tonumber(A(9)), tonumber(A(10)), KEYS[3], A(13), tonumber(A(14)), A(15) == '1')
  end
end
-- the transition these records caused (a worker reports only its own)
local changed = ''
if d.circuit ~= before and d.circuit ~= 'half_open' then changed = d.circuit end
return {h_save(KEYS[1], d), changed}
