"""The Lua scripts as Python text (generated: ``python -m scrapy_openclaw.distributed.lua``; do not edit).

The fallback for a copy of the package whose ``.lua`` files did not travel:
one vendored into a project's egg by a ``setup.py`` without package data.
"""

SCRIPTS = {
    "ack": r"""-- ARGV: boost, worker, ack1, ack2, ... (an id, or "<id>\1<place>": see ack() in queue.lua)
-- -> the ids whose acknowledgement did not count (another worker holds the entry, or it is gone)
-- The ids this worker holds (the common case) are removed together, one call per key; the
-- others go through ack() one by one (a late ack; see queue.lua).
-- (runs after the shared queue.lua, see __init__.py)
local boost, worker = tonumber(ARGV[1]), ARGV[2]
local missed = {}
for first = 3, #ARGV, 1000 do  -- (bounded: unpack's stack)
  local ids, places = {}, {}
  for i = first, math.min(first + 999, #ARGV) do
    local id, place = ack_token(ARGV[i])
    table.insert(ids, id)
    table.insert(places, place)
  end
  local owners = redis.call('HMGET', OWNER, unpack(ids))
  local mine, seen = {}, {}
  for i, id in ipairs(ids) do
    if seen[id] then  -- (acknowledged twice in one call: once)
    elseif owners[i] == worker then
      table.insert(mine, id)
      if legacy(id) then redis.call('HDEL', INFO, id) end
    elseif owners[i] or ack(id, worker, boost, places[i]) == 0 then
      table.insert(missed, id)
    end
    seen[id] = true
  end
  if #mine > 0 then  -- leased: only in INFL (see ack() in queue.lua)
    redis.call('ZREM', INFL, unpack(mine))
    redis.call('HDEL', OWNER, unpack(mine))
    local fields = {}
    for _, id in ipairs(mine) do
      table.insert(fields, id)
      table.insert(fields, released(id))
    end
    redis.call('HDEL', DATA, unpack(fields))  -- (its release count with it)
  end
end
return missed
""",
    "counts": r"""-- {ready, delayed, inflight, discovered} of each shard whose keys are given, in one round trip:
-- KEYS are groups of four (the shard's q, delayed, inflight and found keys, rounds.COUNTED), one
-- group per shard (on one Redis every shard in one call; on a cluster a call per shard, its slot).
-- (ready: the priority set holds every ready entry; an earlier version kept a count beside it)
local out = {}
for i = 1, #KEYS, 4 do
  out[#out + 1] = {redis.call('ZCARD', KEYS[i]), redis.call('ZCARD', KEYS[i + 1]), redis.call('ZCARD', KEYS[i + 2]),
    tonumber(redis.call('GET', KEYS[i + 3]) or '0')}
end
return out
""",
    "dlq_add": r"""-- Adds a dead letter once: a retried XADD after a lost reply must not duplicate it.
-- KEYS: stream, <stream>:ids. ARGV: record id, record data -> 1 added, 0 already there
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
local sid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'data', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], sid)
return 1
""",
    "dlq_update": r"""-- Replaces a dead letter in place (same record id; the entry moves to the stream's end).
-- KEYS: stream, <stream>:ids. ARGV: record id, record data -> 1 replaced, 0 unknown id
local old = redis.call('HGET', KEYS[2], ARGV[1])
if not old then return 0 end
redis.call('XDEL', KEYS[1], old)
local sid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'data', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], sid)
return 1
""",
    "h_acquire": r"""-- ARGV: now, policy_json, token(1/0) -> {ok, record}
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local now = tonumber(ARGV[1])
local d, p = h_load(KEYS[1], now, ARGV[2])
local ok = h_acquire(d, p, now, ARGV[3] == '1')
local flat = h_save(KEYS[1], d)
if ok then return {1, flat} end
return {0, flat}
""",
    "h_control": r"""-- Operator overrides (HealthRegistry.control). ARGV: now, policy_json, then name/value pairs
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
""",
    "h_crawl_delay": r"""-- robots.txt Crawl-delay (0: none). ARGV: now, policy_json, seconds, owed -> record (the stored value, see h_save)
-- (owed: pages already past the queue that the download slot spaces instead)
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local d, p = h_load(KEYS[1], tonumber(ARGV[1]), ARGV[2])
d.crawl_delay = math.max(0, tonumber(ARGV[3]))
if d.crawl_delay > 0 then d.tokens = math.min(d.tokens, 0) - (tonumber(ARGV[4]) or 0) end
return h_save(KEYS[1], d)
""",
    "h_declare": r"""-- The limit the domain's RateLimit headers declare (HealthRegistry.declare_limit).
-- ARGV: now, policy_json, pace (req/s; 0: none any more) -> record (the stored value, see h_save)
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local now = tonumber(ARGV[1])
local d, p = h_load(KEYS[1], now, ARGV[2])
h_declare(d, p, now, tonumber(ARGV[3]) or 0)
return h_save(KEYS[1], d)
""",
    "h_ensure": r"""-- Create the state if missing and store the policy. ARGV: now, policy_json, domain,
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
""",
    "h_hold": r"""-- Holds only ever extend. ARGV: now, policy_json, until -> record (the stored value, see h_save)
-- (runs after the shared health.lua, see __init__.py)
h_index = {KEYS[2], ARGV[#ARGV], KEYS[3]}  -- the domain index (last ARGV: the domain), the fit's history
local d, p = h_load(KEYS[1], tonumber(ARGV[1]), ARGV[2])
d.hold_until = math.max(d.hold_until, tonumber(ARGV[3]))
return h_save(KEYS[1], d)
""",
    "h_record": r"""-- ARGV: one or more records of the domain, 16 values each: now, policy_json, success(1/0),
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
""",
    "health": r"""-- The rate controller, a line-by-line port of scrapy_openclaw/health/registry/ (pacing.py, recording.py)
-- (HealthRegistry). A domain's record is one MessagePack map (one GET and one SET per script,
-- no field parsed from text): the names of registry._Domain's slots (a None left out), plus
-- 'pol' (the domain's HealthPolicy and the registry's module constants, as RedisHealthRegistry's
-- policy JSON decodes, itself packed: a save copies it unread; a None in it is left out, so
-- optional knobs are tested with type() == 'number'), 'pid' (that JSON's "_id": a script handed the same policy does not
-- decode it again), 'ttl_at', 'fit' and 'fitfull' (see h_save and h_note).
-- Where each rule lives in the Python original:
--
--   h_load          HealthRegistry._get (new domain = _Domain.__init__; health
--                   recovery, token refill at the current rate, open -> half-open
--                   after the cooldown, a lost half-open probe is forgotten)
--   h_ceiling/h_rate/h_burst  pacing.ceiling_of / rate_of / burst_of
--   h_declare       pacing.declare (the limit a site's RateLimit headers declare)
--   h_blocked_until HealthRegistry.blocked_until
--   h_ready_at      HealthRegistry.ready_at
--   h_given_up      HealthRegistry.given_up + _give_up_limit (the pop hands such a
--                   domain's requests out ungated: the worker's health middleware
--                   dead-letters them)
--   h_acquire       HealthRegistry.try_acquire (token=false: hold/circuit only,
--                   still takes the probe)
--   h_success       HealthRegistry.record_success (+ count_delivered, the 5xx
--                   share's decay, pacing.observe_latency; latency congestion ->
--                   pacing.decrease, else pacing.increase: slow start, then the cubic)
--   h_failure       HealthRegistry.record_failure. The verdict (registry._verdict:
--                   domain or page, and whether it counts in the 5xx share) and
--                   penalty/congestion (registry._penalty) come from Python, judged
--                   on the worker's cached state
--   h_open          HealthRegistry._open (cool-down doubling per unforgiven
--                   opening, capped, with jitter drawn in Python)
--   h_decrease      pacing.decrease (at most once per max(1 s, latency);
--                   the learned limit is min(allowed, delivered), or the fit's;
--                   a 429 just after a hold only halves the burst)
--   h_fit           LimitHistory.fit and .burst (limitfit.py)
--
-- tests/test_distributed_parity.py drives both with the same events and compares
-- every field: change one side and that test tells you to change the other.
-- K (the module constants, k_name = tuning._NAME) is written before this file by lua/__init__.py;
-- a policy reads them through its metatable (p.k_burst_seconds), the domain's knobs from itself
local K_INDEX = {__index = K}
local HF = {'health', 'rate', 'tokens', 'threshold', 'updated', 'last_decrease',
  'circuit', 'opened_at', 'probe_at', 'latency', 'best_latency', 'hold_until',
  'consecutive_failures', 'requests', 'successes', 'failures', 'cooldown', 'opens', 'down_since',
  'answered_at', 'last_success', 'share_fast', 'share_slow', 'win_start', 'win_ok', 'delivered',
  'crawl_delay', 'troubled_at', 'cuts', 'born', 'blocked_seconds', 'circuit_seconds', 'retry_after_holds',
  'burst_cap', 'declared', 'cut_below', 'cut_refused', 'fall_from',
  'iv_start', 'iv_ok', 'iv_refused', 'iv_cut', 'iv_pace', 'iv_clean', 'iv_first_refused', 'iv_last_ok', 'ref_share', 'ref_pace', 'ref_ok', 'refusals_flat', 'rate_cost',
  'ctl_hold', 'ctl_rate', 'ctl_concurrency', 'ctl_down'}
local h_ttl = 0  -- seconds an idle domain's hash lives (policy k_key_ttl; 0: for ever), set by h_load
-- {index key, domain, history key}, set by a script that may create the state: a new state joins
-- the index, and the history's TTL is set with the hash's (h_save)
local h_index = nil
-- record key -> {raw = the value h_load read, pol (packed)/pid = the policy to store, ttl_at, fit}
local h_stored = {}

local function f17(x)
  if x == nil then return '' end
  return string.format('%.17g', x)
end

local function h_ceiling(d, p)
  local ceiling = p.k_max_rate
  if type(p.base_rate) == 'number' then ceiling = math.max(p.min_rate, p.base_rate * d.health / 100) end
  if d.ctl_rate > 0 then ceiling = math.min(ceiling, d.ctl_rate) end  -- the operator's ceiling
  if d.declared > 0 then ceiling = math.min(ceiling, d.declared * p.k_declared_share) end  -- the site's word
  if d.crawl_delay > 0 then ceiling = math.min(ceiling, 1 / d.crawl_delay) end
  return ceiling
end
local function h_rate(d, p) return math.min(math.max(d.rate, p.min_rate), h_ceiling(d, p)) end
local function h_burst(d, p)
  if d.crawl_delay > 0 then return 1 end
  local burst = math.min(p.burst, math.floor(h_rate(d, p) * p.k_burst_seconds))
  if d.burst_cap > 0 then burst = math.min(burst, d.burst_cap) end
  return math.max(1, burst)
end

-- A number read from a record; nil when it is not one within bounds (anyone who can write to
-- Redis can write the record: distributed/fields.py applies the same bounds and reports the field).
-- An earlier version's hash holds text.
local function h_num(s)
  local v = s
  if type(s) == 'string' then
    if #s > 40 then return nil end
    v = tonumber(s)
  elseif type(s) ~= 'number' then
    return nil
  end
  if v == nil or v ~= v or v > 1e10 or v < -1e10 then return nil end
  return v
end

-- The stored record as a map, or nil (none, or not a map: a forged value is not acted on and
-- the next save replaces it). An earlier version's hash (GET: WRONGTYPE) is read field by field.
local function h_read(hkey)
  local raw = redis.pcall('GET', hkey)
  if type(raw) == 'string' then
    local ok, m = pcall(cmsgpack.unpack, raw)
    if not ok or type(m) ~= 'table' then return nil, raw end
    if type(m.pol) == 'string' then
      local fine, pol = pcall(cmsgpack.unpack, m.pol)
      m.pol_raw, m.pol = m.pol, nil
      if fine and type(pol) == 'table' then m.pol = pol end
    end
    return m, raw
  end
  if type(raw) ~= 'table' then return nil, nil end  -- (false: no key)
  -- an earlier version's record: a hash of text fields, read once and replaced by the next save
  local fields = redis.call('HMGET', hkey, 'policy', unpack(HF))
  local extra = redis.call('HMGET', hkey, 'ttl_at', 'fit')
  local m = {ttl_at = extra[1] or nil, fit = extra[2] or nil}
  for i, name in ipairs(HF) do m[name] = fields[i + 1] or nil end
  if m.ttl_at ~= 'p' then m.ttl_at = h_num(m.ttl_at) end
  if fields[1] then
    local ok, pol = pcall(cjson.decode, fields[1])
    if ok and type(pol) == 'table' then m.pol, m.pol_raw = pol, cmsgpack.pack(pol) end
  end
  return m, nil
end

local h_advance  -- (defined below h_load)

-- The domain's record brought up to now; nil when it has no state and no policy.
-- pjson: the policy JSON a worker hands over ('' or nil: the stored one; none stored: nil).
local function h_load(hkey, now, pjson)
  local m, raw = h_read(hkey)
  local p, pid, packed = nil, nil, nil
  if pjson ~= nil and pjson ~= '' then pid = string.match(pjson, '^{"_id":"(%x+)"') or pjson end
  if m and m.pol and (pid == nil or m.pid == pid) then
    p, pid, packed = m.pol, m.pid, m.pol_raw
  elseif pid then
    p = cjson.decode(pjson)
    packed = cmsgpack.pack(p)
  else
    return nil
  end
  setmetatable(p, K_INDEX)
  m = m or {}
  h_stored[hkey] = {raw = raw, pol = packed, pid = pid, ttl_at = m.ttl_at, fit = h_num(m.fit)}
  h_ttl = tonumber(p.k_key_ttl) or 0
  local d = {fit_start = h_num(m.fit), fit_full = false}  -- (not fields: see h_note)
  if m.health == nil then
    d.fresh = true
    d.health, d.rate, d.threshold = 100, p.initial_rate, nil
    d.tokens = math.max(1, math.min(p.burst, math.floor(p.initial_rate * p.k_burst_seconds)))
    d.updated, d.last_decrease = now, 0
    d.circuit, d.opened_at, d.probe_at, d.latency, d.best_latency, d.hold_until = 'closed', 0, 0, nil, nil, 0
    d.consecutive_failures, d.requests, d.successes, d.failures = 0, 0, 0, 0
    d.cooldown, d.opens, d.down_since = p.circuit_cooldown, 0, 0
    d.answered_at, d.last_success, d.share_fast, d.share_slow = 0, 0, 0, 0
    d.win_start, d.win_ok, d.delivered, d.crawl_delay, d.troubled_at, d.cuts = now, 0, nil, 0, 0, 0
    d.born, d.blocked_seconds, d.burst_cap, d.declared, d.cut_below, d.cut_refused = now, 0, 0, 0, 0, 0
    d.fall_from = 0
    d.circuit_seconds, d.retry_after_holds = 0, 0
    d.iv_start, d.iv_ok, d.iv_refused, d.ref_share, d.ref_pace, d.ref_ok, d.refusals_flat = now, 0, 0, 0, 0, 0, 0
    d.iv_cut, d.iv_pace, d.iv_clean, d.iv_first_refused, d.iv_last_ok = 0, 0, 0, 0, 0
    d.rate_cost = 0
    d.ctl_hold, d.ctl_rate, d.ctl_concurrency, d.ctl_down = 0, 0, 0, 0
    return d, p
  end
  local circuit = m.circuit
  d = m  -- (the map read, its fields checked in place: a number within bounds is left as it is)
  for i = 1, #HF do
    local name = HF[i]
    local v = d[name]
    if not (type(v) == 'number' and v == v and v <= 1e10 and v >= -1e10) then d[name] = h_num(v) end
  end
  d.fit_start, d.fit_full, d.circuit = h_num(m.fit), m.fitfull == 1 and h_num(m.fit) ~= nil, circuit
  if d.circuit ~= 'open' and d.circuit ~= 'half_open' then d.circuit = 'closed' end
  -- (a field left out as invalid: the value a new record has)
  d.health = math.min(100, math.max(0, d.health or 100))
  d.rate, d.tokens, d.updated = math.max(0, d.rate or p.initial_rate), d.tokens or 1, d.updated or now
  d.opened_at, d.probe_at, d.hold_until = d.opened_at or 0, d.probe_at or 0, math.max(0, d.hold_until or 0)
  d.consecutive_failures = math.max(0, d.consecutive_failures or 0)
  d.requests, d.successes = math.max(0, d.requests or 0), math.max(0, d.successes or 0)
  d.failures, d.opens = math.max(0, d.failures or 0), math.max(0, d.opens or 0)
  d.cooldown = d.cooldown or p.circuit_cooldown
  -- (a record from before a field existed)
  d.down_since, d.answered_at, d.last_success = d.down_since or 0, d.answered_at or 0, d.last_success or 0
  d.share_fast, d.share_slow, d.crawl_delay = d.share_fast or 0, d.share_slow or 0, d.crawl_delay or 0
  d.win_start, d.win_ok, d.last_decrease = d.win_start or now, d.win_ok or 0, d.last_decrease or 0
  d.troubled_at, d.cuts, d.born = d.troubled_at or 0, d.cuts or 0, d.born or d.updated
  d.blocked_seconds, d.burst_cap = d.blocked_seconds or 0, d.burst_cap or 0
  d.declared = math.min(math.max(0, d.declared or 0), p.k_max_rate)
  d.cut_below, d.cut_refused = d.cut_below or 0, math.max(0, d.cut_refused or 0)
  d.fall_from = math.max(0, math.floor(d.fall_from or 0))
  d.circuit_seconds, d.retry_after_holds = d.circuit_seconds or 0, math.max(0, d.retry_after_holds or 0)
  d.iv_start, d.iv_ok, d.iv_refused = d.iv_start or now, d.iv_ok or 0, d.iv_refused or 0
  d.iv_cut, d.iv_pace, d.iv_clean = d.iv_cut or 0, d.iv_pace or 0, d.iv_clean or 0
  d.iv_first_refused, d.iv_last_ok = d.iv_first_refused or 0, d.iv_last_ok or 0
  d.ref_share, d.ref_pace, d.ref_ok = d.ref_share or 0, d.ref_pace or 0, d.ref_ok or 0
  d.refusals_flat = d.refusals_flat or 0
  d.rate_cost = math.min(100, math.max(0, d.rate_cost or 0))
  d.ctl_hold, d.ctl_rate = math.max(0, d.ctl_hold or 0), math.max(0, d.ctl_rate or 0)
  d.ctl_concurrency, d.ctl_down = math.max(0, d.ctl_concurrency or 0), d.ctl_down or 0
  if d.ctl_down ~= 0 and d.ctl_down ~= 1 then d.ctl_down = 0 end
  h_advance(d, p, now)
  return d, p
end

-- The record brought up to *now* (HealthRegistry._get's part after the read): health recovery,
-- token refill at the current rate, open -> half-open after the cooldown, a lost probe forgotten.
-- A script that applies several records of one domain advances between them, as a read would.
h_advance = function(d, p, now)
  local elapsed = now - d.updated
  if elapsed > 0 then
    local blocked_end = math.max(d.hold_until, d.ctl_hold)
    if d.circuit == 'open' then
      blocked_end = math.max(blocked_end, d.opened_at + d.cooldown)
      d.circuit_seconds = d.circuit_seconds + math.max(0, math.min(now, d.opened_at + d.cooldown) - d.updated)
    end
    d.blocked_seconds = d.blocked_seconds + math.max(0, math.min(now, blocked_end) - d.updated)
    d.health = math.min(100, d.health + p.recovery_per_minute * elapsed / 60)
    -- nothing saved up while the circuit is open (a hold saves at most the burst)
    local open_end = 0
    if d.circuit == 'open' then open_end = d.opened_at + d.cooldown end
    local unblocked = now - math.max(d.updated, math.min(now, open_end))
    d.tokens = math.min(h_burst(d, p), d.tokens + unblocked * h_rate(d, p))
    d.updated = now
  end
  if d.circuit == 'open' and now >= d.opened_at + d.cooldown then
    d.circuit, d.probe_at = 'half_open', 0
  elseif d.circuit == 'half_open' and d.probe_at ~= 0 and now - d.probe_at > math.max(d.cooldown, p.k_probe_lost_after) then
    d.probe_at = 0
  end
end

local h_flush_notes  -- (below: the limit fit's notes wait for the record's save)

-- Store the record; returns the stored value (the worker's cache reads it: fields.unpack_state).
-- keep_ttl: leave the TTL to the scripts that know the history's key (the pop).
local function h_save(hkey, d, keep_ttl)
  h_flush_notes()  -- (its start, d.fit_start, is saved with the record)
  local stored = h_stored[hkey] or {}
  local m = {}
  for i = 1, #HF do m[HF[i]] = d[HF[i]] end
  m.pol, m.pid, m.fit = stored.pol, stored.pid, d.fit_start
  if d.fit_full and d.fit_start ~= nil then m.fitfull = 1 end
  -- The TTL (HealthRegistry.evict_idle: what outlives idleness never expires) moves when it
  -- must move by more than a quarter of itself, not on every save: the fit history's would
  -- otherwise cost a PEXPIRE per response. It expires at most h_ttl / 4 early.
  local ttl_at, expire_ms = stored.ttl_at, nil
  if h_ttl > 0 and not keep_ttl then
    if d.circuit ~= 'closed' or d.ctl_down ~= 0 or d.ctl_rate > 0 or d.ctl_concurrency > 0 or d.crawl_delay > 0 then
      if ttl_at ~= 'p' then ttl_at, expire_ms = 'p', -1 end
    else
      -- relative to the record's own clock (its times are the workers'), past any hold
      local held = math.max(0, d.hold_until - d.updated, d.ctl_hold - d.updated)
      local target = d.updated + held + h_ttl
      local mark = tonumber(ttl_at or '')
      if mark == nil or target - mark > h_ttl / 4 or target < mark - h_ttl then
        ttl_at, expire_ms = target, math.floor((held + h_ttl) * 1000)
      end
    end
  end
  m.ttl_at = ttl_at
  local blob = cmsgpack.pack(m)
  if blob ~= stored.raw or expire_ms then
    -- (a SET drops the key's TTL unless told: PX sets the new one, KEEPTTL keeps it)
    if expire_ms == -1 then
      redis.call('SET', hkey, blob)
    elseif expire_ms then
      redis.call('SET', hkey, blob, 'PX', expire_ms)
    else
      redis.call('SET', hkey, blob, 'KEEPTTL')
    end
  end
  h_stored[hkey] = {raw = blob, pol = stored.pol, pid = stored.pid, ttl_at = ttl_at, fit = d.fit_start}
  if d.fresh and h_index then
    redis.call('SADD', h_index[1], h_index[2])
    d.fresh = nil
  end
  if expire_ms and expire_ms > 0 and h_index and h_index[3] then
    redis.call('PEXPIRE', h_index[3], expire_ms)  -- (the history's with it)
  end
  return blob
end

local function h_blocked_until(d, p)
  local circuit_end = 0
  if d.circuit == 'open' then circuit_end = d.opened_at + d.cooldown end
  return math.max(d.hold_until, circuit_end, d.ctl_hold)
end

-- HealthRegistry.given_up: down (circuit not closed) for give_up_after seconds,
-- or unreachable_give_up when the domain never answered.
local function h_given_up(d, p, now)
  if d.ctl_down ~= 0 then return true end  -- given up by the operator
  local limit = p.give_up_after
  if d.answered_at == 0 and type(p.unreachable_give_up) == 'number' then limit = p.unreachable_give_up end
  return type(limit) == 'number' and d.circuit ~= 'closed' and d.down_since ~= 0
    and now - d.down_since >= limit
end

local function h_ready_at(d, p, now)
  local ready = math.max(now, h_blocked_until(d, p))
  if d.circuit == 'half_open' and d.probe_at ~= 0 then ready = math.max(ready, now + p.k_probe_recheck) end
  if d.tokens < 1 then ready = math.max(ready, now + (1 - d.tokens) / h_rate(d, p)) end
  return ready
end

local function h_acquire(d, p, now, token)
  local probe_out = d.circuit == 'half_open' and d.probe_at ~= 0
  if h_blocked_until(d, p) > now or probe_out or (token and d.tokens < 1) then return false end
  if token then d.tokens = d.tokens - 1 end
  if d.circuit == 'half_open' then d.probe_at = now end
  return true
end

-- The limit fit (scrapy_openclaw/health/registry/limitfit.py, LimitHistory): the
-- history is the list fkey, its first element the start bin, then one int per event
-- (the bin of an answer that took a token, -bin - 1 for a 429).
local function fit_bin(at, born, p) return math.max(0, math.floor((at - born) / p.k_fit_bin)) end

-- The history's start bin is kept in the hash (d.fit_start, field 'fit'), so the notes of a
-- script are one RPUSHX (h_flush_notes: before the history is read, and with the record's
-- save); a list that expired or was removed under a start is begun again, as if trimmed.
local h_buf = nil  -- {fkey, d, p, items = {{index, answered}...}}: notes waiting for their RPUSHX

local function note_event(index, answered)
  if answered then return index end
  return -index - 1
end

-- The history's events from bin *start* on, after *start* itself (the list a trim or a
-- LimitHistory.refilled leaves), and whether a 429 is among them.
local function fit_events_from(fkey, start)
  local kept, any429 = {start}, false
  for _, v in ipairs(redis.call('LRANGE', fkey, 1, -1)) do
    local e = tonumber(v)
    local at_bin = e
    if e < 0 then at_bin = -e - 1 end
    if at_bin >= start then
      table.insert(kept, e)
      if e < 0 then any429 = true end
    end
  end
  return kept, any429
end

-- A note of the event at bin *index* (answered: took a token; else a 429).
local function note_at(fkey, d, p, index, answered)
  local start = d.fit_start
  if start ~= nil and d.fit_full and index < start then return end  -- (sent before the hold that refilled it)
  if h_buf ~= nil and h_buf.fkey ~= fkey then h_flush_notes() end  -- (another domain's history)
  if start ~= nil then  -- (the list holds its start: the note waits for the others)
    if h_buf == nil then h_buf = {fkey = fkey, d = d, p = p, items = {}} end
    table.insert(h_buf.items, {index, answered})
  else  -- (LimitHistory(index): from birth, or as if trimmed)
    h_flush_notes()
    if index < p.k_fit_horizon_bins then
      start = 0
    elseif answered then
      return  -- a domain past its first seconds keeps no history until a 429
    else
      start = index
    end
    redis.call('DEL', fkey)  -- (a list left without its start in the hash)
    redis.call('RPUSH', fkey, start, note_event(index, answered))
    if h_ttl > 0 then redis.call('PEXPIRE', fkey, math.floor(h_ttl * 1000)) end
    d.fit_start, d.fit_full = start, false
  end
  if index - start > math.floor(3 * p.k_fit_horizon_bins / 2) then  -- trim to the horizon
    h_flush_notes()  -- (a list found gone on the way is begun again: no trim then)
    if d.fit_start == nil or index - d.fit_start <= math.floor(3 * p.k_fit_horizon_bins / 2) then return end
    local new_start = index - p.k_fit_horizon_bins
    local kept, any429 = fit_events_from(fkey, new_start)
    redis.call('DEL', fkey)
    d.fit_full = false
    if not any429 then  -- no 429 left: nothing to fit, the history goes
      d.fit_start = nil
      return
    end
    for i = 1, #kept, 1000 do redis.call('RPUSH', fkey, unpack(kept, i, math.min(i + 999, #kept))) end
    d.fit_start = new_start
    if h_ttl > 0 then redis.call('PEXPIRE', fkey, math.floor(h_ttl * 1000)) end
  end
end

h_flush_notes = function()
  local buf = h_buf
  if buf == nil then return end
  h_buf = nil
  local events = {}
  for i, item in ipairs(buf.items) do events[i] = note_event(item[1], item[2]) end
  local pushed = 0
  for i = 1, #events, 1000 do
    pushed = redis.call('RPUSHX', buf.fkey, unpack(events, i, math.min(i + 999, #events)))
    if pushed == 0 then break end
  end
  if pushed == 0 then  -- the list was gone (expired, removed): begun again, note by note
    buf.d.fit_start, buf.d.fit_full = nil, false
    for _, item in ipairs(buf.items) do note_at(buf.fkey, buf.d, buf.p, item[1], item[2]) end
    h_flush_notes()
  end
end

local function h_note(fkey, d, p, at, answered) note_at(fkey, d, p, fit_bin(at, d.born, p), answered) end

-- (full: begun where a hold had just refilled the bucket, LimitHistory.full: judged at once)
local function fit_judged(index, start, full, p) return full or start == 0 or index >= start + p.k_fit_burn_in_bins end

-- LimitHistory._replay: M and m at rate.
local function fit_replay(events, start, full, rate, p)
  local w, most, least, before = 0, 0, math.huge, start
  local drain = rate * p.k_fit_bin
  for _, e in ipairs(events) do
    local index = e
    if e < 0 then index = -e - 1 end
    if index > before then
      w = math.max(0, w - drain * (index - before))
      before = index
    end
    if e >= 0 then
      w = w + 1
      if w > most then most = w end
    elseif w < least and fit_judged(index, start, full, p) then
      least = w
    end
  end
  return most, least
end

local function fit_slack(events, start, full, rate, p)
  local most, least = fit_replay(events, start, full, rate, p)
  if least > 0 then return most - least end
  return math.huge
end

-- LimitHistory._bisect: the rate in [low, high] where below (true at low) turns false, by halvings.
local function fit_bisect(low, high, below, p)
  if below(high) then return high end
  for _ = 1, p.k_fit_whole_bisect do
    local middle = (low + high) / 2
    if below(middle) then low = middle else high = middle end
  end
  return low
end

-- LimitHistory._whole: the band of rates under a where a whole burst explains the history (its middle or top).
local function fit_whole(events, start, full, a, middle, p)
  local slack = p.k_fit_whole_slack
  local floor = a / p.k_fit_whole_range
  local function most_at(rate) local most = fit_replay(events, start, full, rate, p); return most end
  local function least_at(rate) local _, least = fit_replay(events, start, full, rate, p); return least end
  local first = math.max(1, math.ceil(most_at(a) - slack))
  local most_taken = least_at(floor)  -- (the most any rate in range leaves a 429 taken)
  for burst = first, first + p.k_fit_whole_bursts - 1 do
    if most_taken <= burst - 1 - slack then break end
    local top = fit_bisect(floor, a, function(rate) return least_at(rate) > burst - 1 - slack end, p)
    if most_at(top) <= burst + slack then
      if not middle then return top end
      local bottom = fit_bisect(floor, top, function(rate) return most_at(rate) > burst + slack end, p)
      return math.sqrt(bottom * top)
    end
  end
  return a
end

-- LimitHistory.fit: the largest consistent rate near guess (or up to top), or nil; and LimitHistory.burst at it.
local function h_fit(fkey, full, guess, top, p)
  h_flush_notes()
  local raw = redis.call('LRANGE', fkey, 0, -1)
  if #raw < 2 then return nil end
  local start, events = tonumber(raw[1]), {}
  for i = 2, #raw do events[i - 1] = tonumber(raw[i]) end
  local episodes, last = 0, -math.huge
  for _, e in ipairs(events) do
    if e < 0 then
      local index = -e - 1
      if fit_judged(index, start, full, p) then
        if index - last >= p.k_fit_episode_bins then episodes = episodes + 1 end
        last = index
      end
    end
  end
  if episodes < 2 then return nil end
  local rates, slacks = {}, {}
  local high = p.k_fit_high
  if top > guess * p.k_fit_step ^ p.k_fit_high then
    high = math.ceil(math.log(top / guess) / math.log(p.k_fit_step))
  end
  for k = p.k_fit_low, high do
    local rate = guess * p.k_fit_step ^ k
    table.insert(rates, rate)
    table.insert(slacks, fit_slack(events, start, full, rate, p))
  end
  local best = 1
  for i = 2, #slacks do if slacks[i] < slacks[best] then best = i end end
  local least = slacks[best]
  if least == math.huge or best == 1 or best == #slacks then return nil end
  local top = best
  while top + 1 <= #slacks and (slacks[top + 1] < 1 or slacks[top + 1] <= least) do top = top + 1 end
  if full and top == #slacks then return nil end  -- (consistent up to the pace itself: too few answers)
  local a = rates[top]
  local b = a * p.k_fit_step
  for _ = 1, p.k_fit_refine do
    local c = (a + b) / 2
    local slack = fit_slack(events, start, full, c, p)
    if slack < 1 or slack <= least then a = c else b = c end
  end
  if full then  -- the geometric middle of the consistent rates under a (down to half of it)
    local low = a
    while low > a / 2 and fit_slack(events, start, full, low / p.k_fit_step, p) < 1 do low = low / p.k_fit_step end
    a = math.sqrt(low * a)
  elseif a * p.k_fit_bin <= p.k_fit_whole_bin_drain then  -- (bins fine enough to tell whole bursts apart)
    -- the band where a whole burst explains it: its middle for the first fit, else its top
    a = fit_whole(events, start, full, a, episodes == 2, p)
  end
  local most = fit_replay(events, start, full, a, p)
  return a, math.max(1, math.floor(most))
end

-- LimitHistory.restart: the history begins again at bin *index*, as if trimmed there.
local function h_fit_restart(fkey, d, index)
  h_flush_notes()
  local start = math.max(1, index)
  redis.call('DEL', fkey)
  redis.call('RPUSH', fkey, start)
  if h_ttl > 0 then redis.call('PEXPIRE', fkey, math.floor(h_ttl * 1000)) end
  d.fit_start, d.fit_full = start, false
end

-- LimitHistory.refilled: the history begins again at bin *index*, where a hold has just refilled
-- the bucket (its 429s judged at once), the events already noted from there on kept.
local function h_fit_refilled(fkey, d, index)
  h_flush_notes()
  local start = math.max(1, index)
  local kept = {start}
  if d.fit_start ~= nil then kept = fit_events_from(fkey, start) end
  redis.call('DEL', fkey)
  for i = 1, #kept, 1000 do redis.call('RPUSH', fkey, unpack(kept, i, math.min(i + 999, #kept))) end
  if h_ttl > 0 then redis.call('PEXPIRE', fkey, math.floor(h_ttl * 1000)) end
  d.fit_start, d.fit_full = start, true
end

-- pacing.begin_after_fall: after a fall, the history begins again where the bucket is known full
-- (the hold after the fall's first refusal under the limit, when recent; else this refusal's
-- hold), or, without such a hold, at this request as if trimmed there.
local function h_begin_after_fall(fkey, d, p, index, refilled_at)
  if d.fall_from ~= 0 and index - d.fall_from > 0 and index - d.fall_from <= p.k_fall_lookback_bins then
    h_fit_refilled(fkey, d, d.fall_from)
  elseif refilled_at ~= nil then
    h_fit_refilled(fkey, d, fit_bin(refilled_at, d.born, p))
  else
    h_fit_restart(fkey, d, index)
  end
end

local function h_declare(d, p, now, pace)
  d.declared = math.min(math.max(0, pace), p.k_max_rate)
  if d.declared <= 0 then return end
  d.threshold = d.declared * p.k_declared_share
  d.rate = math.min(d.threshold, h_ceiling(d, p))
  d.cuts = 2
  d.last_decrease = now - p.k_min_decrease_gap
  d.tokens = math.min(d.tokens, h_burst(d, p))
end

local function h_increase(d, p, now)
  local grown
  local since = math.max(0, now - math.max(d.last_decrease, math.min(d.hold_until, now)))
  if d.cuts == 0 then
    local doublings = math.min(math.max(0, now - d.born) / p.k_slow_start_doubling, 60)
    grown = math.min(d.rate * (1 + p.k_slow_start_gain), p.initial_rate * 2 ^ doublings)
  elseif d.cuts == 1 and d.threshold ~= nil then
    grown = math.max(d.rate, d.threshold * p.rate_decrease * p.k_probe_growth ^ math.min(since, p.k_max_probe_seconds))
  else  -- the cubic, then past k_beyond x the learned limit exponential probing (pacing._plateau)
    local flat_at = ((1 - p.rate_decrease) / p.rate_probe) ^ (1 / 3)
    if d.cuts == p.k_resumed then since = flat_at + math.max(0, since - p.k_seed_plateau) end
    local held = d.hold_until - d.last_decrease  -- (a probe costs such a hold: probe less often)
    if since > flat_at and held > p.k_probe_hold then
      since = flat_at + (since - flat_at) * p.k_probe_hold / held
    end
    local beyond_at = flat_at + ((p.k_beyond - 1) / p.rate_probe) ^ (1 / 3)
    local factor
    if since <= beyond_at then
      factor = 1 + p.rate_probe * (since - flat_at) ^ 3
    else
      factor = p.k_beyond * p.k_probe_growth ^ math.min(since - beyond_at, p.k_max_probe_seconds)
    end
    grown = math.max(d.rate, d.threshold * factor)
  end
  d.rate = math.min(grown, h_ceiling(d, p), p.k_max_rate)
end

-- pacing.dry: a limiter's refusals that let nothing through for long enough are a block, not a limit.
local function h_dry(d, now, p)
  if d.cuts == 0 or d.threshold == nil or d.threshold <= 0 or d.last_success == 0 or d.declared > 0 then
    return false
  end
  local held = math.max(0, d.hold_until - d.last_decrease)
  local wait = math.max(p.k_dry_seconds, p.k_dry_gaps / d.threshold, p.k_dry_holds * held)
  return now - d.last_success >= wait + p.k_dry_latencies * (d.latency or 0)
end

-- fkey: the history for the limit fit (a 429 from the second on), or nil.
-- sent: when the refused request was sent (nil: now). refilled_at: when the hold this refusal
-- brings ends, if it refills the bucket (recording.refilled_at), or nil.
local function h_decrease(d, p, now, measured, rate_bound, fkey, sent, refilled_at)
  if now - d.last_decrease < math.max(p.k_min_decrease_gap, d.latency or 0) then
    if not measured or sent == nil or sent <= d.last_decrease or sent >= now then return false end
    d.cut_refused = d.cut_refused + 1  -- refused at the cut pace: again once too many say so
    if d.cut_refused < p.k_cut_again or now - d.last_decrease < (d.latency or 0) then return false end
  end
  d.cut_refused = 0
  if measured and h_dry(d, now, p) then  -- pacing.ride_out: a block halves the pace, keeps the limit
    if d.delivered ~= nil and d.delivered > 0 then
      d.threshold = math.max(d.threshold or 0, math.min(d.delivered, p.k_max_rate))
    end
    d.rate = math.max(p.min_rate, h_rate(d, p) * p.k_cut_floor)
    d.tokens = math.min(d.tokens, h_burst(d, p))
    d.cut_below, d.fall_from = 0, 0
    d.last_decrease = now
    if fkey ~= nil then h_fit_restart(fkey, d, fit_bin(sent or now, d.born, p)) end
    return true
  end
  local in_burst = false  -- (pacing.in_burst)
  if measured and d.cuts >= 1 and now >= d.hold_until and h_burst(d, p) > 1 then
    in_burst = (sent or now) - d.hold_until <= math.min(p.k_burst_seconds, (h_burst(d, p) + 1) / h_rate(d, p))
  end
  if measured and d.cuts >= 1 and d.declared > 0 and h_burst(d, p) > 1 then in_burst = true end  -- (bunched: declared)
  if in_burst then
    -- refused while resuming from a hold: a smaller burst, the pace stands (pacing.decrease)
    d.burst_cap = math.max(1, math.floor(h_burst(d, p) / 2))
    d.tokens = math.min(d.tokens, d.burst_cap)
    d.last_decrease = now
    return true
  end
  local rate = h_rate(d, p)
  local before = rate
  local delivered, span = 0, now - d.win_start
  if span >= 0 and d.delivered ~= nil then
    delivered = (d.delivered * p.k_window + d.win_ok) / (p.k_window + span)
  elseif span >= 0 then
    delivered = d.win_ok / math.max(span, p.k_window)
  end
  if delivered > 0 then
    local floor = 0
    if d.cuts >= 1 and measured then floor = before * p.k_cut_floor
    elseif d.cuts >= 1 then floor = before * p.rate_decrease end
    before = math.min(before, math.max(delivered, floor))
  end
  local fallen = false
  if measured and fkey ~= nil then  -- pacing.fell: the second cut in a row at no more than the learned limit
    local below = d.cuts == 2 and d.threshold ~= nil and d.threshold > 0 and rate <= d.threshold
    local again = below and d.cut_below ~= 0
    if below then d.cut_below = 1 else d.cut_below = 0 end
    if again then  -- (another bucket's history)
      fallen = true
      h_begin_after_fall(fkey, d, p, fit_bin(sent or now, d.born, p), refilled_at)
    end
  end
  if measured and d.cuts >= 1 and fkey ~= nil then
    local fitted, burst = h_fit(fkey, d.fit_full, before, rate, p)
    -- (it replaces the window's reading; after a fall, only a higher one)
    if fitted ~= nil and not (fallen and fitted * p.k_fit_margin < before) then
      before = math.min(rate, fitted * p.k_fit_margin)
      d.burst_cap = burst
    end
  end
  -- only a 429 (measured) or latency (rate_bound) moves on to the cubic plateau; 503s and
  -- timeouts cut and probe back up
  if d.cuts == 0 then d.iv_cut, d.iv_pace = now, d.rate end  -- refusals.end_slow_start
  if measured or rate_bound then d.cuts = math.min(d.cuts + 1, 2) else d.cuts = math.min(math.max(d.cuts, 1), 2) end
  d.threshold = before
  d.rate = math.max(p.min_rate, before * p.rate_decrease)
  d.tokens = math.min(d.tokens, h_burst(d, p))
  d.last_decrease = now
  -- (where a fall's evidence would begin: the hold after this cut under the learned limit)
  d.fall_from = 0
  if measured and d.cut_below ~= 0 and refilled_at ~= nil then d.fall_from = math.max(1, fit_bin(refilled_at, d.born, p)) end
  return true
end

local function h_count_delivered(d, p, now)
  d.win_ok = d.win_ok + 1
  local span = now - d.win_start
  if span < p.k_window then return end
  if span <= p.k_stale_window then
    d.delivered = d.win_ok / span
  end
  d.win_start, d.win_ok = now, 0
end

-- jitter: the factor drawn in Python (registry._uniform(1 - j, 1 + j)), used only when opening.
local function h_open(d, p, now, jitter)
  if d.circuit == 'closed' then d.down_since = now end  -- an outage begins
  if d.circuit == 'closed' and d.opens ~= 0 then
    local healthy = math.max(0, now - (d.opened_at + d.cooldown))
    d.opens = math.max(0, d.opens - math.floor(healthy / p.circuit_cooldown))
  end
  local cap = math.max(p.circuit_cooldown_max, p.circuit_cooldown)
  local base = math.min(cap, p.circuit_cooldown * 2 ^ math.min(d.opens, p.k_max_doublings))
  if p.circuit_jitter ~= 0 then d.cooldown = base * jitter else d.cooldown = base end
  d.opens = math.min(d.opens + 1, p.k_max_doublings)
  d.circuit, d.opened_at, d.probe_at = 'open', now, 0
  d.tokens = 1  -- the probe's, and no more
end

local function h_count(d, refused, sent)
  if refused then
    d.iv_refused = d.iv_refused + 1
    if d.iv_first_refused == 0 or sent < d.iv_first_refused then d.iv_first_refused = sent end
  else
    d.iv_ok = d.iv_ok + 1
    d.iv_last_ok = math.max(d.iv_last_ok, sent)
  end
end

-- refusals._open_interval
local function h_open_interval(d, now)
  d.iv_start, d.iv_ok, d.iv_refused, d.iv_first_refused, d.iv_last_ok = now, 0, 0, 0, 0
end

-- refusals._close_slow_start
local function h_close_slow_start(d, p, now)
  local n = d.iv_ok + d.iv_refused
  local span = math.max(now - d.iv_start, 1e-3)
  local enough = n >= p.k_pace_short or (n >= p.k_pace_few and d.iv_last_ok > d.iv_first_refused and d.iv_first_refused > 0)
  if enough and d.iv_refused / n >= p.k_flat_min_share and d.refusals_flat == 0 and d.iv_clean == 0 then
    d.ref_share, d.ref_pace, d.ref_ok = d.iv_refused / n, math.min(d.iv_pace, n / span), d.iv_ok / span
  end
  d.iv_cut, d.iv_pace = 0, 0
  h_open_interval(d, now)
end

-- refusals.pace_sample: count an answer (to a request sent at *sent*) in the pace interval;
-- true when it made the domain's refusals pace-independent.
local function h_pace_sample(d, p, now, refused, sent)
  if d.iv_cut ~= 0 then
    if sent < d.iv_cut then
      h_count(d, refused, sent)
      return false
    end
    h_close_slow_start(d, p, now)
  end
  h_count(d, refused, sent)
  local n = d.iv_ok + d.iv_refused
  if n < p.k_pace_sample and (n < p.k_pace_short or now - d.iv_start < p.k_pace_span) then return false end
  local span = math.max(now - d.iv_start, 1e-3)
  local pace, share, ok = h_rate(d, p), d.iv_refused / n, d.iv_ok
  h_open_interval(d, now)
  if d.refusals_flat ~= 0 then
    if share >= math.min(d.refusals_flat * p.k_flat_rise + p.k_flat_min_share, p.k_flat_rise_cap) then  -- (refusals._risen)
      d.refusals_flat, d.ref_share, d.ref_pace, d.ref_ok = 0, share, pace, ok / span
    end
    return false
  end
  if share < p.k_flat_min_share or d.cuts == 0 then
    d.ref_share, d.ref_pace, d.ref_ok = 0, 0, 0
    if share < p.k_flat_min_share then d.iv_clean = 1 else d.iv_clean = 0 end
    return false
  end
  local delivered = ok / span
  if d.ref_share == 0 or pace > d.ref_pace then
    if d.iv_clean ~= 0 then  -- the refusals began in this interval: it straddles the change
      d.iv_clean = 0
      return false
    end
    d.ref_share, d.ref_pace, d.ref_ok = share, pace, ok / math.max(span, p.k_window)  -- (over a second at least)
    return false
  end
  if pace > p.k_flat_slower * d.ref_pace then return false end
  local kept = share >= p.k_flat_kept * d.ref_share and share < math.min(p.k_flat_rise * d.ref_share + p.k_flat_min_share, p.k_flat_rise_cap)
  local fell = delivered <= math.min(p.k_flat_delivered, pace / math.max(d.ref_pace, 1e-9) + p.k_flat_pace_slack) * d.ref_ok
  if kept and ok >= p.k_flat_min_ok and fell then
    d.refusals_flat = share
    return true
  end
  d.ref_share, d.ref_pace, d.ref_ok = share, pace, delivered
  return false
end

-- refusals.keep_pace
local function h_keep_pace(d, p, now)
  d.cuts, d.threshold, d.burst_cap = 0, nil, 0
  d.rate = math.max(d.rate, p.initial_rate)
  d.hold_until = math.min(d.hold_until, now)
  d.health = math.min(100, d.health + d.rate_cost)
  d.rate_cost = 0
end

-- latency: a number >= 0, or nil (no sample). Returns true when congested.
local function h_observe_latency(d, p, latency)
  if latency == nil then return false end
  if d.latency == nil then d.latency = latency else d.latency = d.latency + p.k_latency_alpha * (latency - d.latency) end
  if d.best_latency == nil or d.latency < d.best_latency then
    d.best_latency = d.latency
    return false
  end
  d.best_latency = d.best_latency + p.k_baseline_drift * (d.latency - d.best_latency)
  return d.successes > p.k_latency_warmup and d.latency > p.latency_factor * d.best_latency + p.k_latency_slack
end

local function h_success(d, p, now, latency, fkey, note_at)
  d.requests = d.requests + 1
  d.successes = d.successes + 1
  d.consecutive_failures = 0
  h_count_delivered(d, p, now)
  if h_pace_sample(d, p, now, false, note_at) then h_keep_pace(d, p, now) end
  h_note(fkey, d, p, note_at, true)
  d.answered_at, d.last_success = now, now
  d.health = math.min(100, d.health + p.success_reward)
  d.share_fast = d.share_fast - p.k_share_fast * d.share_fast
  d.share_slow = d.share_slow - p.k_share_slow * d.share_slow
  local congested = h_observe_latency(d, p, latency)
  if d.circuit == 'half_open' then d.circuit, d.probe_at, d.down_since = 'closed', 0, 0 end
  if congested then h_decrease(d, p, now, false, true) else h_increase(d, p, now) end
end

-- answered/in_share/domain/congestion/measured/throttle/rate_signal: booleans; retry_after: seconds or nil.
-- note: 'a' (an answer that took a token), 'r' (a 429) or '' for the fit history at fkey, sent at note_at.
-- rate_signal: verdicts._rate_signal (a 429 or an answer with Retry-After, not a ban page).
local function h_failure(d, p, now, answered, in_share, domain, penalty, congestion, measured, throttle, retry_after,
                         jitter, fkey, note, note_at, rate_signal)
  d.requests = d.requests + 1
  d.failures = d.failures + 1
  if answered then d.answered_at = now end
  if note ~= '' then h_note(fkey, d, p, note_at, note == 'a') end
  if rate_signal and h_pace_sample(d, p, now, true, note_at) then
    h_keep_pace(d, p, now)
    domain = false  -- (judged on the flat state, as the Python registry judges it)
  end
  if in_share then
    d.share_fast = d.share_fast + p.k_share_fast * (1 - d.share_fast)
    d.share_slow = d.share_slow + p.k_share_slow * (1 - d.share_slow)
  end
  if not domain then
    if d.circuit == 'half_open' then d.probe_at = 0 end
    return
  end
  d.troubled_at = now
  if not rate_signal then d.consecutive_failures = d.consecutive_failures + 1 end
  -- a congestion signal costs its penalty once per event (when it also cuts the
  -- rate); while the circuit is not closed a failure costs no health and no hold
  local fkey_fit = nil
  if measured then fkey_fit = fkey end
  local refilled_at = nil  -- recording.refilled_at
  if retry_after ~= nil and math.min(math.max(retry_after, 0), p.retry_after_cap) >= p.k_fit_full_hold then
    refilled_at = now + math.min(math.max(retry_after, 0), p.retry_after_cap)
  end
  local fresh = congestion and h_decrease(d, p, now, measured, false, fkey_fit, note_at, refilled_at)
  local closed = d.circuit == 'closed'
  if closed and (fresh or not congestion) then
    local floor = 0  -- a rate signal says slower, not sick
    if rate_signal then floor = math.min(d.health, math.max(p.k_rate_health_floor, p.circuit_floor)) end
    local health = math.max(floor, d.health - penalty)
    if rate_signal then d.rate_cost = math.min(100, d.rate_cost + d.health - health) end
    d.health = health
  end
  if retry_after ~= nil then
    d.hold_until = math.max(d.hold_until, now + math.min(math.max(retry_after, 0), p.retry_after_cap))
    d.retry_after_holds = d.retry_after_holds + 1
  elseif throttle and closed then
    d.hold_until = math.max(d.hold_until, now + 1 / h_rate(d, p))
  end
  if d.circuit == 'half_open' or (d.circuit == 'closed' and not rate_signal and
      (d.health < p.circuit_floor or d.consecutive_failures >= p.circuit_failures)) then
    h_open(d, p, now, jitter)
  end
end
""",
    "heartbeat": r"""-- Extend this worker's leases and requeue everyone's expired ones.
-- ARGV: boost, worker, now, lease_until, reclaim, id1, ... -> {extended, requeued}
-- reclaim = 1 (the first beat after a failover): an entry this worker holds that the server
-- has waiting with no owner (the new master never saw its pop) is leased to it again, so no
-- other worker fetches it a second time. Its id then comes as "<id>\1<place>", the place being
-- "<domain>\1<priority order>" of its ready-set member ('' when not known): an entry held
-- inline has no DATA value to find it by.
-- (runs after the shared queue.lua, see __init__.py)
local worker = ARGV[2]
local reclaim = ARGV[5] == '1'
local n = 0

local ids, places = {}, {}
for i = 6, #ARGV do
  local id, place = ARGV[i], ''
  if reclaim then id, place = ack_token(ARGV[i]) end
  table.insert(ids, id)
  table.insert(places, place)
end
local owners = hmget(OWNER, ids)
local extend = {}  -- (this worker's leases: one ZADD)
for i, id in ipairs(ids) do
  local owner = owners[i]
  if owner == worker then
    table.insert(extend, ARGV[4])
    table.insert(extend, id)
    n = n + 1
  elseif reclaim and not owner then
    local info = nil
    if redis.call('HEXISTS', DATA, id) == 1 then
      info = info_of(id)
    else
      info = waiting_inline(id, places[i])
      if info then redis.call('HSET', DATA, id, leased_value(info)) end
    end
    if info then
      unindex(id, info, tonumber(ARGV[1]))
      redis.call('ZREM', DELAYED, id)
      redis.call('ZADD', INFL, ARGV[4], id)
      redis.call('HSET', OWNER, id, worker)
      n = n + 1
    end
  end
end
for first = 1, #extend, 1000 do
  redis.call('ZADD', INFL, 'XX', unpack(extend, first, math.min(first + 999, #extend)))
end
return {n, maintain(tonumber(ARGV[3]), 1000, tonumber(ARGV[1]))}
""",
    "items": r"""-- Items of finished pages, written once each (``distributed/items.py``).
-- KEYS: the items list, the hash of pages whose items are written (same slot: see items.py)
-- ARGV: worker, n_forget, forget1..n, then per page: page id ("" for items of no page), n, item1..n
-- -> the page ids whose items were written before (by a worker that died before its ack): not again
-- A page's items and its mark go together; the mark is forgotten once its acknowledgement
-- counted (forget), so a page fetched again after a worker died is not written twice.
local list, marks = KEYS[1], KEYS[2]
local worker, n_forget = ARGV[1], tonumber(ARGV[2])
for first = 3, 2 + n_forget, 1000 do  -- (bounded: unpack's stack)
  redis.call('HDEL', marks, unpack(ARGV, first, math.min(first + 999, 2 + n_forget)))
end
local pages, at = {}, {}
local i = 3 + n_forget
while i <= #ARGV do
  local id, n = ARGV[i], tonumber(ARGV[i + 1])
  table.insert(pages, {id, i + 2, n})
  if id ~= '' then table.insert(at, id) end
  i = i + 2 + n
end
local written = {}
for first = 1, #at, 1000 do
  local chunk = {unpack(at, first, math.min(first + 999, #at))}
  local seen = redis.call('HMGET', marks, unpack(chunk))
  for j, id in ipairs(chunk) do
    if seen[j] then written[id] = true end
  end
end
local again, items, fresh = {}, {}, {}
for _, page in ipairs(pages) do
  local id, from, n = page[1], page[2], page[3]
  if written[id] then
    table.insert(again, id)
  else
    if id ~= '' then
      table.insert(fresh, id)
      table.insert(fresh, worker)
      written[id] = true  -- (one page twice in one call: once)
    end
    for j = from, from + n - 1 do table.insert(items, ARGV[j]) end
  end
end
for first = 1, #fresh, 1000 do
  redis.call('HSET', marks, unpack(fresh, first, math.min(first + 999, #fresh)))
end
for first = 1, #items, 1000 do
  redis.call('RPUSH', list, unpack(items, first, math.min(first + 999, #items)))
end
return again
""",
    "lock_acquire": r"""-- Takes a scheduler window's lock unless the window is done.
-- KEYS: lock, done marker. ARGV: token, ttl (ms) -> 1 taken, 0 not
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
""",
    "lock_extend": r"""-- Extends a scheduler window's lock if this token still holds it.
-- KEYS: lock. ARGV: token, ttl (ms) -> 1 extended, 0 lost
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
""",
    "lock_release": r"""-- Releases a scheduler window's lock if this token still holds it (compare-and-delete),
-- leaving the done marker when the run finished.
-- KEYS: lock, done marker. ARGV: token, finished ('1'/'0'), done ttl (ms) -> 1 released, 0 lost
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3]) end
redis.call('DEL', KEYS[1])
return 1
""",
    "pop": r"""-- KEYS: the shard's 16 keys, then the health hash of each candidate domain.
-- ARGV: boost, now, lease_until, worker, scan, gated (1/0), want, candidate domains...
-- The candidates are the domains the caller expects to be due (the last reply's
-- 'next' list): their health keys must be declared, so the script cannot pick
-- domains it was not told about while gating. A due domain that was not a
-- candidate makes the reply 'retry' (call again with the new list).
-- Up to *want* entries are leased, each chosen as if by a call of its own (a domain's health
-- record is read and written once, whatever it gave).
-- Returns {status, x, payload, requeued, {dropped payloads}, {domain, record, ...}, {next}, {id, payload, ...}}
--   status 'ok': x = entry id (the first leased; the others follow in the last list);
--   'wait': x = when to look again; 'empty'; 'retry'.
--   dropped: entries whose deadline passed with the "drop" policy (dead letters);
--   states: the health state of every domain whose token the pop looked at;
--   next: the domains due now (at most scan; else the soonest), for the next call.
-- (runs after the shared health.lua and queue.lua, see __init__.py)
local boost, now, lease_until, worker = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local scan, gated, want = tonumber(ARGV[5]), ARGV[6] == '1', math.max(1, math.min(16, tonumber(ARGV[7]) or 1))
local hkeys = {}
for i = 8, #ARGV do hkeys[ARGV[i]] = KEYS[16 + i - 7] end
local requeued = maintain(now, 200, boost)
local dropped = {}

local function next_list()
  local doms = redis.call('ZRANGEBYSCORE', DOMS, '-inf', now, 'LIMIT', 0, scan)
  if #doms == 0 then doms = redis.call('ZRANGE', DOMS, 0, scan - 1) end
  return doms
end

-- A and E hold members only for entries with a deadline: a shard without any skips their reads.
local deadlines = redis.call('EXISTS', E) == 1

-- An entry read from Q: {id, tier, eff, more, member} (an inline entry's info is its member's).
local function entry_of(member, more)
  local id, p, info = ready_entry(member)
  return {id = id, tier = 1, eff = p, more = more, info = info, member = member}
end

-- A shard without deadlines (the common case) is "batched": the call keeps what it read of Q
-- and DOMS in step with its own leases, and writes them once at the end (flush()).
local batched = not deadlines
local heads = {}  -- batched: domain -> {list = members read in order, pos = the next, full = more may follow}

-- The domain's first entry in priority order, its info not read, or nil. more: whether the
-- domain has another ready entry (taking this one leaves it in DOMS).
local function head_of(dom)
  if not batched then
    local head = redis.call('ZRANGEBYLEX', Q, lo(dom), hi(dom), 'LIMIT', 0, 2)
    if not head[1] then return nil end
    return entry_of(head[1], head[2] ~= nil)
  end
  local h = heads[dom]
  if h == nil then
    local list = redis.call('ZRANGEBYLEX', Q, lo(dom), hi(dom), 'LIMIT', 0, 2)
    h = {list = list, pos = 1, full = #list == 2}
    heads[dom] = h
  end
  if h.pos == #h.list and h.full then  -- is there one after it? (read on, from past the last)
    local more = redis.call('ZRANGEBYLEX', Q, '(' .. h.list[#h.list], hi(dom), 'LIMIT', 0, 2)
    for _, m in ipairs(more) do table.insert(h.list, m) end
    h.full = #more == 2
  end
  if h.pos > #h.list then return nil end
  return entry_of(h.list[h.pos], h.pos < #h.list)
end

-- The best entry of a domain: {id, tier, eff, info} or nil (the domain has no ready entry). The
-- priority head's info is read only if it is taken (its priority is in its member's sort key).
local function best_of(dom)
  if not deadlines then return head_of(dom) end
  for _ = 1, 4 do  -- bounded: drop-policy entries past their deadline become dead letters
    local late = redis.call('ZRANGEBYLEX', E, lo(dom), '[' .. dom .. SEP .. enc(now) .. SEP .. '\255', 'LIMIT', 0, 16)
    if #late == 0 then break end
    local boosted = nil
    for _, m in ipairs(late) do
      local id = id_of(m)
      local info = info_of(id)
      if info.x == 'drop' then
        forget(id, boost)
        if info.payload then table.insert(dropped, info.payload) end
      elseif boosted == nil then
        boosted = {id = id, tier = 2, eff = -info.d, info = info}
      end
    end
    if boosted then return boosted end
  end
  local best = head_of(dom)
  for _ = 1, 4 do  -- bounded: an aging member left behind (a worker with another boost) is dropped
    local aging = redis.call('ZRANGEBYLEX', A, lo(dom), hi(dom), 'LIMIT', 0, 1)
    if not aging[1] then break end
    local id = id_of(aging[1])
    local info = info_of(id)
    if not redis.call('ZSCORE', Q, q_member(id, info)) then
      redis.call('ZREM', A, aging[1])
    else
      if info.w > 0 then
        local eff = math.max(info.p, info.p + boost + (now - info.d) * boost / info.w)
        if best == nil or eff > best.eff then best = {id = id, tier = 1, eff = eff, info = info} end
      end
      break
    end
  end
  return best
end

-- The due domains (DOMS scored up to now, at most scan): {doms, since = domain -> its score, or
-- nil once this call made it not due, complete = every due domain was read}. Batched and
-- complete, the call keeps it in step with its own writes instead of reading DOMS again.
local scanned = nil
local flush  -- (below)

local function due_domains()
  if scanned == nil or not scanned.complete or not batched then
    flush()
    local scored = redis.call('ZRANGEBYSCORE', DOMS, '-inf', now, 'WITHSCORES', 'LIMIT', 0, scan)
    scanned = {doms = {}, since = {}, complete = #scored < 2 * scan}
    for i = 1, #scored, 2 do
      table.insert(scanned.doms, scored[i])
      scanned.since[scored[i]] = tonumber(scored[i + 1])
    end
  end
  return scanned
end

-- The domains due now for the next call: the scan's, when it saw all of them (one read less).
local function next_due()
  if scanned == nil or not scanned.complete then flush() return next_list() end
  local due = {}
  for _, dom in ipairs(scanned.doms) do
    if scanned.since[dom] then table.insert(due, dom) end
  end
  if #due == 0 then flush() return next_list() end  -- (none left due: the soonest, so the next call may gate them)
  return due
end

-- The call's writes to DOMS (domain -> score, or false: removed), in order of first write.
local dom_writes, dom_order = {}, {}
local function set_dom(dom, score)
  if dom_writes[dom] == nil then table.insert(dom_order, dom) end
  dom_writes[dom] = score
  if not batched then flush() end
end

local pend = {q = {}, infl = {}, owner = {}, data = {}}  -- the leases' writes, batched
flush = function()
  if #pend.q > 0 then redis.call('ZREM', Q, unpack(pend.q)) end
  if #pend.infl > 0 then redis.call('ZADD', INFL, unpack(pend.infl)) end
  if #pend.owner > 0 then redis.call('HSET', OWNER, unpack(pend.owner)) end
  if #pend.data > 0 then redis.call('HSET', DATA, unpack(pend.data)) end
  pend = {q = {}, infl = {}, owner = {}, data = {}}
  local add, gone = {}, {}
  for _, dom in ipairs(dom_order) do
    local score = dom_writes[dom]
    if score then
      table.insert(add, score)
      table.insert(add, dom)
    else
      table.insert(gone, dom)
    end
  end
  if #add > 0 then redis.call('ZADD', DOMS, 'XX', unpack(add)) end
  if #gone > 0 then redis.call('ZREM', DOMS, unpack(gone)) end
  dom_writes, dom_order = {}, {}
end

local taken = {}  -- the entries leased so far: id, payload, ...
local function take(c)
  c.info = c.info or info_of(c.id)
  local dom, info = c.dom, c.info
  table.insert(pend.q, c.member or q_member(c.id, info))
  if info.d > 0 and info.w > 0 then  -- (its aging and deadline members, at once: not batched)
    redis.call('ZREM', A, dom .. SEP .. enc(info.d - info.p * info.w / boost) .. SEP .. c.id)
    redis.call('ZREM', E, dom .. SEP .. enc(info.d) .. SEP .. c.id)
  end
  table.insert(pend.infl, lease_until)
  table.insert(pend.infl, c.id)
  table.insert(pend.owner, c.id)
  table.insert(pend.owner, worker)
  if info.member then  -- inline: a lease is held by DATA, as every lease (ack, release, expiry)
    table.insert(pend.data, c.id)
    table.insert(pend.data, leased_value(info))
  end
  if heads[dom] then heads[dom].pos = heads[dom].pos + 1 end
  local more = c.more
  if more == nil then  -- (a deadline's pick, not the domain's head: count what is left)
    flush()
    more = redis.call('ZLEXCOUNT', Q, lo(dom), hi(dom)) > 0
  end
  if more then
    set_dom(dom, now)
    scanned.since[dom] = now
  else
    set_dom(dom, false)
    scanned.since[dom] = nil
  end
  table.insert(taken, c.id)
  table.insert(taken, info.payload or c.id)
end

-- The domains whose record this call read (domain -> {key, d, p}), written once at the end.
local loaded, order = {}, {}
local function state_of(dom)
  local s = loaded[dom]
  if s == nil then
    local hkey = hkeys[dom]
    local d, p = h_load(hkey, now, nil)
    s = {hkey = hkey, d = d, p = p}
    loaded[dom] = s
    if d then table.insert(order, dom) end
  end
  return s.d, s.p
end

local function saved_states()
  local states = {}
  for _, dom in ipairs(order) do
    local s = loaded[dom]
    table.insert(states, dom)
    table.insert(states, h_save(s.hkey, s.d, true))
  end
  return states
end

local wait, missed = nil, false
-- One lease, chosen among the due domains: true when taken (else wait / missed say why not).
local function pick()
  wait, missed = nil, false
  local cands = {}
  -- A due domain's score is when it became due, or was last served (take() sets it to now): the
  -- lowest wins a tie, so the domain served least recently goes first.
  local due = due_domains()
  for _, dom in ipairs(due.doms) do
    if not due.since[dom] then  -- (made not due by this call)
    elseif gated and dom ~= '' and hkeys[dom] == nil then
      missed = true
    else
      local b = best_of(dom)
      if b then
        b.dom = dom
        b.served = due.since[dom]
        table.insert(cands, b)
      else
        set_dom(dom, false)
        due.since[dom] = nil
      end
    end
  end
  table.sort(cands, function(a, b)
    if a.tier ~= b.tier then return a.tier > b.tier end
    if a.eff ~= b.eff then return a.eff > b.eff end
    if a.served ~= b.served then return a.served < b.served end
    return a.dom < b.dom
  end)
  for _, c in ipairs(cands) do
    local ok, at = true, now
    if gated and c.dom ~= '' then
      local d, p = state_of(c.dom)
      if d and not h_given_up(d, p, now) then  -- (no state: nobody has set a pace for the domain;
        -- given up: out it goes ungated, to be dead-lettered)
        at = h_ready_at(d, p, now)
        if at > now then ok = false else ok = h_acquire(d, p, now, true) end
        if not ok and at <= now then at = now + p.k_retry_poll end
      end
    end
    if ok then
      take(c)
      return true
    end
    set_dom(c.dom, at)
    if at > now then due.since[c.dom] = nil end
    if wait == nil or at < wait then wait = at end
  end
  if #cands > 0 and (wait == nil or now < wait) then
    -- blocked domains stepped aside: others may be due now
    local others = false
    if due.complete and batched then
      for _, dom in ipairs(due.doms) do
        if due.since[dom] then others = true end
      end
    else
      flush()
      others = redis.call('ZCOUNT', DOMS, '-inf', now) > 0
    end
    if others then wait = now end
  end
  return false
end

for _ = 1, want do  -- bounded: at most 16 leases per call
  if not pick() then break end
end
flush()
local states = saved_states()
if #taken > 0 then
  local first_id, first_payload = taken[1], taken[2]
  local more = {}
  for i = 3, #taken do more[i - 2] = taken[i] end
  return {'ok', first_id, first_payload, requeued, dropped, states, next_due(), more}
end
if missed then return {'retry', '0', '', requeued, dropped, states, next_list(), {}} end
local nxt = redis.call('ZRANGEBYSCORE', DOMS, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if nxt[2] and (wait == nil or tonumber(nxt[2]) < wait) then wait = tonumber(nxt[2]) end
local head = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
if head[2] and (wait == nil or tonumber(head[2]) < wait) then wait = tonumber(head[2]) end
if wait == nil then return {'empty', '0', '', requeued, dropped, states, next_list(), {}} end
return {'wait', f17(wait), '', requeued, dropped, states, next_list(), {}}
""",
    "push": r"""-- KEYS: the shard's 16 keys (SEEN: the shard's part of the dupefilter).
-- ARGV: boost, worker, then 8 per request, in order: id, payload, info_json, not_before, now,
--       (info and payload are one DATA value, see queue.lua's split_entry, or a ready entry's Q
--       member: see inline_info)
--       ack_id, fingerprint ('' = unchecked),
--       copy (1: a retry or redirect copy of a leased request, 0: a request discovered now)
-- Returns one reply per request: 1 when queued, 2 when queued ready for a domain that had no
-- ready entry in the shard (idle workers are told, see wakeup.py), 0 when the fingerprint was
-- already seen. FOUND counts the discovered ones (the progress line's "discovered": a copy is
-- the same request again). One call carries a round's consecutive pushes to one shard.
-- The dupefilter mark and the push are one step: marked-but-not-queued (a worker
-- killed between two round trips) would filter the page for good, since the
-- parent's re-fetch finds its child "seen". A filtered copy still acknowledges
-- ack_id (a redirect to a seen URL finishes the original request); ack_id is
-- only given when the original lives in the same shard (same domain).
-- (runs after the shared queue.lua, see __init__.py)
local boost, worker = tonumber(ARGV[1]), ARGV[2]
-- (the call's count of discovered requests, written once; its ready-set members, added at once)
local batch = {doms = {}, found = 0, q = {}}

-- The dupefilter: one SMISMEMBER for the call's fingerprints and one SADD of the new ones,
-- not a SADD each (a page's links come in one call).
local fps = {}
for i = 3, #ARGV, 8 do
  if ARGV[i + 6] ~= '' then table.insert(fps, ARGV[i + 6]) end
end
local seen, marked = {}, {}
local direct = #fps == 1  -- (one fingerprint: its SADD says whether it was seen)
if direct and redis.call('SADD', SEEN, fps[1]) == 0 then seen[fps[1]] = true end
for first = 1, direct and 0 or #fps, 1000 do  -- (bounded: unpack's stack)
  local part = {unpack(fps, first, math.min(first + 999, #fps))}
  local member = redis.call('SMISMEMBER', SEEN, unpack(part))
  for i, fp in ipairs(part) do
    if member[i] == 1 then seen[fp] = true end
  end
end

-- ack_id: the original's acknowledgement ("<id>\1<place>", see ack() in queue.lua)
local function ack_of(token)
  add_ready(batch)  -- (an ack may read Q: a domain's last entry leaves DOMS)
  local id, place = ack_token(token)
  return ack(id, worker, boost, place)
end

local function push(id, payload, info, nb, now, ack_id, fingerprint, copy)
  if fingerprint ~= '' then
    if seen[fingerprint] then
      if ack_id ~= '' then ack_of(ack_id) end
      return 0
    end
    seen[fingerprint] = true
    if not direct then table.insert(marked, fingerprint) end
  end
  if copy ~= '1' then batch.found = batch.found + 1 end
  local fresh = 0
  if tonumber(nb) > tonumber(now) then
    redis.call('HSET', DATA, id, info .. '\n' .. payload)
    redis.call('ZADD', DELAYED, nb, id)
  else
    local decoded_info = decoded(info, payload)
    if #payload <= INLINE_MAX and decoded_info.short and inline_info(decoded_info.dom, decoded_info.p) == info then
      fresh = make_ready(id, boost, decoded_info, batch, payload)  -- (held by its Q member alone)
    else
      redis.call('HSET', DATA, id, info .. '\n' .. payload)
      fresh = make_ready(id, boost, decoded_info, batch)
    end
  end
  if ack_id ~= '' then ack_of(ack_id) end
  return 1 + fresh
end

local out = {}
for i = 3, #ARGV, 8 do
  table.insert(out, push(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6],
    ARGV[i + 7]))
end
add_ready(batch)
for first = 1, #marked, 1000 do redis.call('SADD', SEEN, unpack(marked, first, math.min(first + 999, #marked))) end
if batch.found > 0 then redis.call('INCRBY', FOUND, batch.found) end
return out
""",
    "queue": r"""-- Queue helpers. Every script of the queue runs on ONE shard and gets that
-- shard's keys as KEYS[1..16] (all under the shard's hash tag, built in Python
-- by ``shards.ShardKeys``): nothing here builds a key name, so the scripts run
-- unchanged on one Redis, a Redis Cluster or under ACL key patterns.
--
-- A shard's ready entries of all its domains live in three sorted sets whose
-- members sort lexicographically as "<domain>\1<sort key>\1<id>" (all scores
-- 0): a domain's best entry is the first member of its prefix (ZRANGEBYLEX,
-- O(log n)), so per-domain keys are not needed.
-- A request queued ready, without a deadline (the common case), is held by its Q member alone,
-- "<domain>\1<sort key>\1<id>\1<payload>" ("inline"): no DATA value until it is leased
-- (take() in pop.lua writes it; a lease that comes back is ready from DATA, by its id).
--   Q  priority order: sort key = enc(-priority), ties by id (FIFO)
--   A  aging order (entries with a deadline): enc(D - p*W/B)
--   E  deadline order (entries with a deadline): enc(D)
local Q, A, E, DOMS, SERVED, SEQ, COUNT, DELAYED, INFL, OWNER, DATA, INFO, REL, REJ, SEEN, FOUND =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10],
  KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local SEP = '\1'

-- a number as a fixed-width string that sorts like the number
local function enc(x)
  x = x + 1e10
  if x < 0 then x = 0 elseif x > 9e14 then x = 9e14 end
  return string.format('%022.6f', x)
end

-- An entry's DATA value is "<info>\n<payload>". The info is "<domain>[\1<priority>[\1<deadline>
-- \1<aging window>\1<expired mode>]]" (left out from the end when 0: a priority-0 entry without
-- a deadline is its domain alone), or, as written before 2026-12-06 (and still for a domain that
-- holds \1, a newline, or begins '{"'), a JSON object. An entry an earlier version queued has its
-- payload alone there and its info in INFO. Its id tells it
-- (those ids had a '-', ours have none), so cleaning up after it needs no read.
local function legacy(id) return string.find(id, '-', 1, true) ~= nil end

local function split_entry(raw)
  local nl = string.find(raw, '\n', 1, true)
  if nl then return string.sub(raw, 1, nl - 1), string.sub(raw, nl + 1) end
  return nil, raw
end

local function payload_of(id)
  local raw = redis.call('HGET', DATA, id)
  if not raw then return nil end
  local _, payload = split_entry(raw)
  return payload
end

-- The entry's info (and, as info.payload, its payload: a pop takes it without another read).
-- info.short: the compact form, whose priority order is the compact one (q_member).
local function decoded(head, payload)
  local info
  if string.sub(head, 1, 2) == '{"' then
    info = cjson.decode(head)
  else
    local dom, rest = string.match(head, '^([^\1]*)\1?(.*)$')
    local p, d, w, x = string.match(rest, '^([^\1]*)\1?([^\1]*)\1?([^\1]*)\1?(.*)$')
    info = {dom = dom, p = tonumber(p), d = tonumber(d), w = tonumber(w), short = true}
    if x ~= '' then info.x = x end
  end
  info.p, info.d, info.w, info.dom = info.p or 0, info.d or 0, info.w or 0, info.dom or ''
  info.payload = payload
  return info
end

-- The entry's member of Q: "<domain>\1<priority order>\1<id>". The compact info's order is
-- 11 digits (1e10 - priority: Scrapy's priorities are integers), the JSON one's 22 (enc): an
-- entry queued before 2026-12-06 sorts before every newer one of its domain.
local function q_member(id, info)
  if not info.short then return info.dom .. SEP .. enc(-info.p) .. SEP .. id end
  local key = 1e10 - info.p
  if key < 0 then key = 0 elseif key > 99999999999 then key = 99999999999 end
  return info.dom .. SEP .. string.format('%011d', key) .. SEP .. id
end

-- The largest payload held inline (bytes): a pop reads the heads of every due domain it looks
-- at, and an inline head comes with its payload (a large POST body stays in DATA, read once).
local INLINE_MAX = 1024

-- The DATA info line of an entry that can be held inline (compact, no deadline, a priority its
-- sort key holds exactly), as push.lua got it; else nil. A leased inline entry's DATA value is
-- rebuilt from its member with it, the same bytes.
local function inline_info(dom, p)
  if 1e10 - p < 0 or 1e10 - p > 99999999999 or p ~= math.floor(p) then return nil end
  if p == 0 then return dom end
  return dom .. SEP .. string.format('%d', p)
end

-- The DATA value of a leased inline entry (*info* from ready_entry): its info line, then its payload.
local function leased_value(info) return inline_info(info.dom, info.p) .. '\n' .. info.payload end

local function info_of(id)
  local raw = redis.call('HGET', DATA, id)
  local head, payload = nil, nil
  if raw then head, payload = split_entry(raw) end
  if not head then head = redis.call('HGET', INFO, id) end
  if head then return decoded(head, payload) end
  return {p = 0, d = 0, w = 0, x = 'boost', dom = '', payload = payload}
end

-- The field of DATA that counts an entry's counted releases (beside its value: an ack's one HDEL
-- removes both; ids never start with '#'). An earlier version kept them in REL.
local function released(id) return '#' .. id end

-- A member of Q read whole: its id, its priority and, held inline (see inline_info), its info
-- with the payload (info.member: the member, to remove it by).
local function ready_entry(member)
  local dom, key, id, rest = string.match(member, '^([^\1]*)\1([^\1]*)\1([^\1]*)(.*)$')
  local p = 1e10 - tonumber(key)
  local info = nil
  if rest ~= '' then  -- inline: "\1<payload>"
    info = {dom = dom, p = p, d = 0, w = 0, short = true, payload = string.sub(rest, 2), member = member}
  end
  return id, p, info
end

-- HGET of each of *fields* of *key*, in one HMGET per 1000 (false: no such field).
local function hmget(key, fields)
  local out = {}
  for first = 1, #fields, 1000 do  -- (bounded: unpack's stack)
    local part = redis.call('HMGET', key, unpack(fields, first, math.min(first + 999, #fields)))
    for i, v in ipairs(part) do out[first + i - 1] = v end
  end
  return out
end

local function id_of(member) return string.match(member, '^[^\1]*\1[^\1]*\1([^\1]*)') end
local function lo(dom) return '[' .. dom .. SEP end
local function hi(dom) return '[' .. dom .. SEP .. '\255' end

-- Returns 1 when the entry's domain had no ready entry before (it joins the domain index).
-- info: the entry's, when the caller has it (else read); batch: a push call's (a domain it made
-- ready is known to be in DOMS; its Q members wait in batch.q for one ZADD, see add_ready).
-- Q holds every ready entry: its ZCARD is the shard's ready count.
-- inline: the payload, for an entry held by its Q member alone (see inline_info).
local function make_ready(id, boost, info, batch, inline)
  info = info or info_of(id)
  local dom = info.dom
  local member = q_member(id, info)
  if inline then member = member .. SEP .. inline end
  if batch and batch.q then
    table.insert(batch.q, 0)
    table.insert(batch.q, member)
  else
    redis.call('ZADD', Q, 0, member)
  end
  local fresh = 0
  if batch == nil or not batch.doms[dom] then
    fresh = redis.call('ZADD', DOMS, 'NX', 0, dom)
    if batch then batch.doms[dom] = true end
  end
  if info.d > 0 and info.w > 0 then
    redis.call('ZADD', A, 0, dom .. SEP .. enc(info.d - info.p * info.w / boost) .. SEP .. id)
    redis.call('ZADD', E, 0, dom .. SEP .. enc(info.d) .. SEP .. id)
  end
  return fresh
end

-- A push call's Q members (batch.q), added in one ZADD (before anything reads Q again).
local function add_ready(batch)
  for first = 1, #batch.q, 1000 do  -- (bounded: unpack's stack)
    redis.call('ZADD', Q, unpack(batch.q, first, math.min(first + 999, #batch.q)))
  end
  batch.q = {}
end

-- more: true when the caller knows the domain has another ready entry. Returns whether it has.
local function unindex(id, info, boost, more)
  local dom = info.dom
  redis.call('ZREM', Q, info.member or q_member(id, info))
  if info.d > 0 and info.w > 0 then
    redis.call('ZREM', A, dom .. SEP .. enc(info.d - info.p * info.w / boost) .. SEP .. id)
    redis.call('ZREM', E, dom .. SEP .. enc(info.d) .. SEP .. id)
  end
  if more ~= true and redis.call('ZLEXCOUNT', Q, lo(dom), hi(dom)) == 0 then
    redis.call('ZREM', DOMS, dom)
    return false
  end
  return true
end

local function forget(id, boost)
  unindex(id, info_of(id), boost)
  redis.call('ZREM', DELAYED, id)
  redis.call('ZREM', INFL, id)
  redis.call('HDEL', OWNER, id)
  redis.call('HDEL', DATA, id, released(id))
  if legacy(id) then redis.call('HDEL', INFO, id) end
  redis.call('HDEL', REL, id)  -- (an earlier version's count; a forget is rare)
end

-- Due delayed entries and expired leases go back to ready. Returns the number requeued.
local function maintain(now, limit, boost)
  local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    redis.call('ZREM', DELAYED, id)
    make_ready(id, boost)
  end
  local expired = redis.call('ZRANGEBYSCORE', INFL, '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    redis.call('ZREM', INFL, id)
    redis.call('HDEL', OWNER, id)
    if redis.call('HEXISTS', DATA, id) == 1 then make_ready(id, boost) end
  end
  return #expired
end

-- An acknowledgement's "<id>\1<place>" (the place: where the entry waits inline, for a server
-- that never saw its pop; see rounds.ack_token), or an id alone -> id, place.
local function ack_token(token)
  return string.match(token, '^([^\1]*)\1?(.*)$')
end

-- The entry *id* waiting inline at *place* ("<domain>\1<priority order>" of its member), or nil.
local function waiting_inline(id, place)
  if place == nil or place == '' then return nil end
  local prefix = place .. SEP .. id
  local m = redis.call('ZRANGEBYLEX', Q, '[' .. prefix .. SEP, '(' .. prefix .. '\2', 'LIMIT', 0, 1)
  if not m[1] then return nil end
  local _, _, info = ready_entry(m[1])
  return info
end

-- Acknowledge: the request is finished. A late ack after the lease expired
-- removes the entry if it is still waiting (no second fetch), and leaves it
-- alone if another worker leased it meanwhile. Returns 1 when removed.
-- place: where the entry waits if it is held inline (a failover lost its pop).
local function ack(id, worker, boost, place)
  local owner = redis.call('HGET', OWNER, id)
  if owner then
    if owner ~= worker then return 0 end
    -- leased: only in INFL (an owner is set by take() and the reclaim, after the entry left the
    -- ready and delayed sets, and cleared by every path that puts it back): 4 calls instead of 10-14
    redis.call('ZREM', INFL, id)
    redis.call('HDEL', OWNER, id)
    redis.call('HDEL', DATA, id, released(id))
    if legacy(id) then redis.call('HDEL', INFO, id) end
    return 1
  end
  if redis.call('HEXISTS', DATA, id) == 1 then
    forget(id, boost)
    return 1
  end
  local inline = waiting_inline(id, place)
  if inline then
    unindex(id, inline, boost)
    return 1
  end
  return 0
end
""",
    "reclaim": r"""-- Hand back the leases of dead workers at once (they stopped answering; see workers.lua).
-- ARGV: boost, dead worker ids... -> number handed back
-- Bounded: the in-flight set holds what the workers lease (their concurrency and prefetch).
-- (runs after the shared queue.lua, see __init__.py)
local boost, dead = tonumber(ARGV[1]), {}
for i = 2, #ARGV do dead[ARGV[i]] = true end
local n = 0
local ids = redis.call('ZRANGE', INFL, 0, 9999)
local owners = hmget(OWNER, ids)
for i, id in ipairs(ids) do
  local owner = owners[i]
  if owner and dead[owner] then
    redis.call('ZREM', INFL, id)
    redis.call('HDEL', OWNER, id)
    if redis.call('HEXISTS', DATA, id) == 1 then
      make_ready(id, boost)
      n = n + 1
    end
  end
end
return n
""",
    "reject": r"""-- Move a refused (undecodable) leased entry aside. ARGV: boost, id, worker, reason
-- (runs after the shared queue.lua, see __init__.py)
local id = ARGV[2]
local payload = payload_of(id) or id
redis.call('HSET', REJ, id, payload)
forget(id, tonumber(ARGV[1]))
return 1
""",
    "release": r"""-- Give leases back at once. ARGV: boost, worker, max_releases (-1: not counted), id1, ...
-- A failed item counts against the entry; past max_releases the entry is removed
-- and its payload returned (the caller turns it into a dead letter).
-- Returns {requeued, {dead payloads}}.
-- (runs after the shared queue.lua, see __init__.py)
local boost, worker, max = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local n, dead = 0, {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', OWNER, id) == worker then
    redis.call('ZREM', INFL, id)
    redis.call('HDEL', OWNER, id)
    local times = 0
    if max >= 0 then times = redis.call('HINCRBY', DATA, released(id), 1) end
    if max >= 0 and times > max then
      local payload = payload_of(id)
      forget(id, boost)
      if payload then table.insert(dead, payload) end
    else
      make_ready(id, boost)
      n = n + 1
    end
  end
end
return {n, dead}
""",
    "sites_replace": r"""-- Replaces a site-memory entry if it is still the one the worker read (compare-and-set on its
-- seal), so two workers saving one domain at once cannot lose each other's counts.
-- KEYS: the domain's hash. ARGV: the seal read ('' = no entry), entry, seal, ttl (s) -> 1 written, 0 changed since
local current = redis.call('HGET', KEYS[1], 'mac') or ''
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'entry', ARGV[2], 'mac', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
""",
    "wake": r"""-- Domains of the shard's index made ready sooner than the pop parked them for (an operator's
-- release, refusals found pace-independent, a higher declared limit: see
-- RedisHealthRegistry._wake). ARGV: now, domains... Each one parked until later is due now
-- (its next pop judges its token); one not in the index is left out. -> how many moved
-- (runs after the shared queue.lua, see __init__.py)
local args = {'XX', 'LT', 'CH'}
for i = 2, #ARGV do
  table.insert(args, ARGV[1])
  table.insert(args, ARGV[i])
end
return redis.call('ZADD', DOMS, unpack(args))
""",
    "workers": r"""-- The crawl's workers, in shard 0's hash tag. KEYS: live (zset: worker -> when it counts as
-- dead, refreshed by its liveness thread), busy (set: workers with work of their own that may
-- not be in the queue yet: start requests, buffered writes, leases), epoch (string: +1 each time
-- a worker turns busy).
-- ARGV: op, now, worker, then
--   'state' busy(1/0) until -> epoch    (the worker's round: after its writes and pops)
--   'look'              -> {epoch, busy live others, {dead workers}}
--   'forget' dead...    -> 0            (once their leases were handed back on every shard)
--   'leave'             -> 0            (a clean close)
local LIVE, BUSY, EPOCH = KEYS[1], KEYS[2], KEYS[3]
local op, now, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if op == 'state' then
  redis.call('ZADD', LIVE, ARGV[5], worker)
  if ARGV[4] == '1' then
    if redis.call('SADD', BUSY, worker) == 1 then redis.call('INCR', EPOCH) end
  else
    redis.call('SREM', BUSY, worker)
  end
  return tonumber(redis.call('GET', EPOCH) or '0')
elseif op == 'look' then
  local busy = 0
  for _, w in ipairs(redis.call('SMEMBERS', BUSY)) do
    local until_ = tonumber(redis.call('ZSCORE', LIVE, w) or '0')
    if w ~= worker and until_ > now then busy = busy + 1 end
  end
  local dead = redis.call('ZRANGEBYSCORE', LIVE, '-inf', now, 'LIMIT', 0, 100)
  return {tonumber(redis.call('GET', EPOCH) or '0'), busy, dead}
elseif op == 'forget' then
  for i = 4, #ARGV do
    local until_ = tonumber(redis.call('ZSCORE', LIVE, ARGV[i]) or '0')
    if until_ <= now then
      redis.call('ZREM', LIVE, ARGV[i])
      redis.call('SREM', BUSY, ARGV[i])
    end
  end
  return 0
elseif op == 'leave' then
  redis.call('ZREM', LIVE, worker)
  redis.call('SREM', BUSY, worker)
  return 0
end
return redis.error_reply('workers.lua: unknown op ' .. tostring(op))
""",
}
