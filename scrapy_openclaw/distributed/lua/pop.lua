-- KEYS: the shard's 16 keys, then the health hash of each candidate domain.
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

-- The domain's first entry in priority order, its info not read: {id, tier, eff} or nil (an
-- inline entry's info is its member's: {..., info}). more: whether the domain has another ready
-- entry (taking this one leaves it in DOMS).
local function head_of(dom)
  local head = redis.call('ZRANGEBYLEX', Q, lo(dom), hi(dom), 'LIMIT', 0, 2)
  if not head[1] then return nil end
  local key, id, rest = string.match(head[1], '^[^\1]*\1([^\1]*)\1([^\1]*)(.*)$')
  local p = 1e10 - tonumber(key)
  local info = nil
  if rest ~= '' then  -- inline: "\1<payload>"
    info = {dom = dom, p = p, d = 0, w = 0, short = true, payload = string.sub(rest, 2), member = head[1]}
  end
  return {id = id, tier = 1, eff = p, more = head[2] ~= nil, info = info}
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

local doms, stepped = nil, {}  -- (the scan's due domains; those it made not due)

-- The domains due now for the next call: the scan's, when it saw all of them (one read less).
local function next_due()
  if #doms >= scan then return next_list() end
  local due = {}
  for _, dom in ipairs(doms) do
    if not stepped[dom] then table.insert(due, dom) end
  end
  if #due == 0 then return next_list() end  -- (none left due: the soonest, so the next call may gate them)
  return due
end

local taken = {}  -- the entries leased so far: id, payload, ...
local function take(c)
  c.info = c.info or info_of(c.id)
  local left = unindex(c.id, c.info, boost, c.more)
  if c.info.member then  -- inline: a lease is held by DATA, as every lease (ack, release, expiry)
    redis.call('HSET', DATA, c.id, inline_info(c.dom, c.info.p) .. '\n' .. c.info.payload)
  end
  redis.call('ZADD', INFL, lease_until, c.id)
  redis.call('HSET', OWNER, c.id, worker)
  if left then
    redis.call('ZADD', DOMS, 'XX', now, c.dom)
  else
    stepped[c.dom] = true
  end
  table.insert(taken, c.id)
  table.insert(taken, c.info.payload or c.id)
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
    table.insert(states, h_save(s.hkey, s.d, nil, true))
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
  local scored = redis.call('ZRANGEBYSCORE', DOMS, '-inf', now, 'WITHSCORES', 'LIMIT', 0, scan)
  local since = {}
  doms, stepped = {}, {}
  for i = 1, #scored, 2 do
    table.insert(doms, scored[i])
    since[scored[i]] = tonumber(scored[i + 1])
  end
  for _, dom in ipairs(doms) do
    if gated and dom ~= '' and hkeys[dom] == nil then
      missed = true
    else
      local b = best_of(dom)
      if b then
        b.dom = dom
        table.insert(cands, b)
      else
        redis.call('ZREM', DOMS, dom)
        stepped[dom] = true
      end
    end
  end
  for _, c in ipairs(cands) do c.served = since[c.dom] end
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
    redis.call('ZADD', DOMS, 'XX', at, c.dom)
    if at > now then stepped[c.dom] = true end
    if wait == nil or at < wait then wait = at end
  end
  if #cands > 0 and (wait == nil or now < wait) then
    -- blocked domains stepped aside: others may be due now
    if redis.call('ZCOUNT', DOMS, '-inf', now) > 0 then wait = now end
  end
  return false
end

for _ = 1, want do  -- bounded: at most 16 leases per call
  if not pick() then break end
end
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
