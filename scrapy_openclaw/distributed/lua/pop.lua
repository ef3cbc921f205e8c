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
