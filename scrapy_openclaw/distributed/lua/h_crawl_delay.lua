-- robots.txt Crawl-delay (0: none). ARGV: now, policy_json, seconds, owed -> record (the stored value, see h_save)
-- (owed: pages already past the queue that the download slot spaces instead)
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local d, p = h_load(KEYS[1], tonumber(ARGV[1]), ARGV[2])
d.crawl_delay = math.max(0, tonumber(ARGV[3]))
if d.crawl_delay > 0 then d.tokens = math.min(d.tokens, 0) - (tonumber(ARGV[4]) or 0) end
return h_save(KEYS[1], d)
