-- The rate controller, a line-by-line port of scrapy_openclaw/health/registry/ (pacing.py, recording.py)
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
