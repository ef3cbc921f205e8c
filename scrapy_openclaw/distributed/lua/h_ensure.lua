-- Create the state if missing and store the policy. ARGV: now, policy_json, domain,
-- then optionally what site memory knows of a new domain (pacing.seed):
-- limit ('' for none), burst cap, Crawl-delay
-- (runs after the shared health.lua, see __init__.py)
local now = tonumber(ARGV[1])
local new = redis.call('EXISTS', KEYS[1]) == 0
local d, p = h_load(KEYS[1], now, ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
if new and ARGV[4] then
  local limit = tonumber(ARGV[4])
  if limit and limit > 0 then
    d.threshold = math.min(limit, p.k_max_rate)
    d.cuts, d.rate = p.k_resumed, d.threshold
    d.last_decrease = now - p.k_min_decrease_gap
    d.burst_cap = math.max(0, tonumber(ARGV[5]) or 0)
    h_open_interval(d, now)  -- (refusals.restart_sample)
    d.iv_cut, d.iv_pace = 0, 0
    d.delivered, d.win_start, d.win_ok = d.threshold, now, 0
  end
  local delay = tonumber(ARGV[6]) or 0
  if delay > 0 then d.crawl_delay = delay end
  d.tokens = math.min(d.tokens, h_burst(d, p))
end
return h_save(KEYS[1], d)
