-- Queue helpers. Every script of the queue runs on ONE shard and gets that
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
