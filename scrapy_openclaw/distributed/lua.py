"""The Lua scripts behind the Redis queue and the shared health registry.

Why Lua: every multi-key change (pop = pick + lease, ack, lease expiry, token
take) must be atomic across workers, and one ``EVALSHA`` is also one round
trip. Only Redis 6.2 features are used (sorted sets, hashes, ``cjson``).

Queue keys (``K`` = the scrapy-redis queue key, e.g. ``chaos:requests``)::

    K             zset  ready entries, score -priority (ties: id order = FIFO)
    K:aging       zset  ready entries with a deadline, score k = D - p*W/B
    K:expiry      zset  ready entries with a deadline, score D
    K:delayed     zset  not-before entries, score = due time
    K:inflight    zset  leased entries, score = lease expiry
    K:owner       hash  id -> worker id holding the lease
    K:data        hash  id -> request payload (JSON)
    K:info        hash  id -> cjson {p, d, w, x, dom}: priority, deadline,
                        aging window, expired mode, domain

A member of ``K`` without a ``K:data`` entry is foreign (e.g. a pickle pushed
by plain scrapy-redis): the member itself is handed back as the payload, and
the Python side refuses it (see ``serializer.py``).

Health keys: ``H .. domain`` hash with the token bucket and health fields
(see ``health.py``).
"""

from __future__ import annotations

# Token bucket take, shared by the pop script and RedisHealthRegistry.try_acquire.
# Returns ok (1/0) and the earliest time a token may be available.
TAKE_TOKEN = r"""
local function take_token(hkey, now)
  local h = redis.call('HMGET', hkey, 'rate', 'burst', 'tokens', 'ts', 'hold', 'circuit', 'open_until', 'probe')
  local rate = tonumber(h[1])
  if not rate then return 1, now end
  local burst = tonumber(h[2]) or 1
  local tokens = tonumber(h[3]) or burst
  local ts = tonumber(h[4]) or now
  local hold = tonumber(h[5]) or 0
  local circuit = h[6] or 'closed'
  if hold > now then return 0, hold end
  if circuit == 'open' then
    local open_until = tonumber(h[7]) or 0
    if now < open_until then return 0, open_until end
    circuit = 'half_open'
    redis.call('HSET', hkey, 'circuit', 'half_open', 'probe', 0)
    h[8] = '0'
  end
  if circuit == 'half_open' and h[8] == '1' then return 0, now + 1 end
  if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate) end
  if tokens >= 1 then
    tokens = tokens - 1
    redis.call('HSET', hkey, 'tokens', tostring(tokens), 'ts', tostring(now))
    if circuit == 'half_open' then redis.call('HSET', hkey, 'probe', 1) end
    return 1, now
  end
  redis.call('HSET', hkey, 'tokens', tostring(tokens), 'ts', tostring(now))
  return 0, now + (1 - tokens) / rate
end
"""

# Put an entry back into the ready indexes (from delayed or an expired lease).
_MAKE_READY = r"""
local function make_ready(K, id)
  local raw = redis.call('HGET', K .. ':info', id)
  local p, d, w, boost = 0, 0, 0, tonumber(ARGV_BOOST) or 100
  if raw then
    local info = cjson.decode(raw)
    p, d, w = info.p or 0, info.d or 0, info.w or 0
  end
  redis.call('ZADD', K, -p, id)
  if d > 0 and w > 0 then
    redis.call('ZADD', K .. ':aging', d - p * w / boost, id)
    redis.call('ZADD', K .. ':expiry', d, id)
  end
end

local function unindex(K, id)
  redis.call('ZREM', K, id)
  redis.call('ZREM', K .. ':aging', id)
  redis.call('ZREM', K .. ':expiry', id)
end

local function forget(K, id)
  unindex(K, id)
  redis.call('ZREM', K .. ':delayed', id)
  redis.call('ZREM', K .. ':inflight', id)
  redis.call('HDEL', K .. ':owner', id)
  redis.call('HDEL', K .. ':data', id)
  redis.call('HDEL', K .. ':info', id)
end

-- Due delayed entries and expired leases go back to ready. Returns the number requeued.
local function maintain(K, now, limit)
  local due = redis.call('ZRANGEBYSCORE', K .. ':delayed', '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    redis.call('ZREM', K .. ':delayed', id)
    make_ready(K, id)
  end
  local expired = redis.call('ZRANGEBYSCORE', K .. ':inflight', '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    redis.call('ZREM', K .. ':inflight', id)
    redis.call('HDEL', K .. ':owner', id)
    if redis.call('HEXISTS', K .. ':data', id) == 1 then make_ready(K, id) end
  end
  return #expired
end

-- Acknowledge: the request is finished. A late ack after the lease expired
-- removes the entry if it is still waiting (no second fetch), and leaves it
-- alone if another worker leased it meanwhile. Returns 1 when removed.
local function ack(K, id, worker)
  local owner = redis.call('HGET', K .. ':owner', id)
  if owner then
    if owner ~= worker then return 0 end
    forget(K, id)
    return 1
  end
  if redis.call('HEXISTS', K .. ':data', id) == 1 then
    forget(K, id)
    return 1
  end
  return 0
end
"""

# KEYS: none (K passed in ARGV to keep one script for any spider).
# ARGV: K, boost, id, payload, info_json, priority, not_before, now, ack_id, worker
PUSH = (
    "local ARGV_BOOST = ARGV[2]\n"
    + _MAKE_READY
    + r"""
local K, id, now = ARGV[1], ARGV[3], tonumber(ARGV[8])
redis.call('HSET', K .. ':data', id, ARGV[4])
redis.call('HSET', K .. ':info', id, ARGV[5])
local nb = tonumber(ARGV[7])
if nb > now then
  redis.call('ZADD', K .. ':delayed', nb, id)
else
  make_ready(K, id)
end
if ARGV[9] ~= '' then ack(K, ARGV[9], ARGV[10]) end
return 1
"""
)

# ARGV: K, boost, now, lease_until, worker, scan, health_prefix ('' = no gating)
# Returns {'ok', id, payload, requeued, dropped...} | {'wait', t, requeued, dropped...}
#         | {'empty', 0, requeued, dropped...}; dropped = flat list of payloads
#         of entries whose deadline passed with the "drop" policy.
POP = (
    "local ARGV_BOOST = ARGV[2]\n"
    + TAKE_TOKEN
    + _MAKE_READY
    + r"""
local K, boost, now, lease_until, worker = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local scan, hprefix = tonumber(ARGV[6]), ARGV[7]
local requeued = maintain(K, now, 200)
local dropped = {}
local cands, seen = {}, {}
local function info_of(id)
  local raw = redis.call('HGET', K .. ':info', id)
  if raw then return cjson.decode(raw) end
  return {p = 0, d = 0, w = 0, x = 'boost', dom = ''}
end
local function add(id, rank)
  if seen[id] then return end
  seen[id] = true
  local info = info_of(id)
  local p, d, w = info.p or 0, info.d or 0, info.w or 0
  local tier, eff = 1, p
  if d > 0 and now >= d then
    if info.x == 'drop' then
      local payload = redis.call('HGET', K .. ':data', id)
      forget(K, id)
      if payload then table.insert(dropped, payload) end
      return
    end
    tier, eff = 2, -d
  elseif d > 0 and w > 0 then
    eff = math.max(p, p + boost + (now - d) * boost / w)
  end
  table.insert(cands, {id = id, tier = tier, eff = eff, rank = rank, dom = info.dom or ''})
end
local rank = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K .. ':expiry', '-inf', now, 'LIMIT', 0, scan)) do
  rank = rank + 1; add(id, rank)
end
for _, id in ipairs(redis.call('ZRANGE', K .. ':aging', 0, scan - 1)) do
  rank = rank + 1; add(id, rank)
end
for _, id in ipairs(redis.call('ZRANGE', K, 0, scan - 1)) do
  rank = rank + 1; add(id, rank)
end
table.sort(cands, function(a, b)
  if a.tier ~= b.tier then return a.tier > b.tier end
  if a.eff ~= b.eff then return a.eff > b.eff end
  return a.rank < b.rank
end)
local wait = nil
local blocked = {}
for _, c in ipairs(cands) do
  local ok, at = 1, now
  if hprefix ~= '' and c.dom ~= '' then
    if blocked[c.dom] then ok = 0 else ok, at = take_token(hprefix .. c.dom, now) end
  end
  if ok == 1 then
    unindex(K, c.id)
    redis.call('ZADD', K .. ':inflight', lease_until, c.id)
    redis.call('HSET', K .. ':owner', c.id, worker)
    local payload = redis.call('HGET', K .. ':data', c.id) or c.id
    local out = {'ok', c.id, payload, requeued}
    for _, d in ipairs(dropped) do table.insert(out, d) end
    return out
  end
  blocked[c.dom] = true
  if wait == nil or at < wait then wait = at end
end
local head = redis.call('ZRANGE', K .. ':delayed', 0, 0, 'WITHSCORES')
if head[2] then
  local due = tonumber(head[2])
  if wait == nil or due < wait then wait = due end
end
local out
if wait == nil then out = {'empty', '0', requeued} else out = {'wait', tostring(wait), requeued} end
for _, d in ipairs(dropped) do table.insert(out, d) end
return out
"""
)

# ARGV: K, boost, worker, id1, id2, ... -> number removed
ACK = (
    "local ARGV_BOOST = ARGV[2]\n"
    + _MAKE_READY
    + r"""
local n = 0
for i = 4, #ARGV do n = n + ack(ARGV[1], ARGV[i], ARGV[3]) end
return n
"""
)

# Extend this worker's leases and requeue everyone's expired ones.
# ARGV: K, boost, worker, now, lease_until, id1, ... -> {extended, requeued}
HEARTBEAT = (
    "local ARGV_BOOST = ARGV[2]\n"
    + _MAKE_READY
    + r"""
local K, worker = ARGV[1], ARGV[3]
local n = 0
for i = 6, #ARGV do
  if redis.call('HGET', K .. ':owner', ARGV[i]) == worker then
    redis.call('ZADD', K .. ':inflight', 'XX', ARGV[5], ARGV[i])
    n = n + 1
  end
end
return {n, maintain(K, tonumber(ARGV[4]), 1000)}
"""
)

# Give leases back at once (graceful shutdown). ARGV: K, boost, worker, id1, ...
RELEASE = (
    "local ARGV_BOOST = ARGV[2]\n"
    + _MAKE_READY
    + r"""
local K, worker = ARGV[1], ARGV[3]
local n = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', K .. ':owner', id) == worker then
    redis.call('ZREM', K .. ':inflight', id)
    redis.call('HDEL', K .. ':owner', id)
    make_ready(K, id)
    n = n + 1
  end
end
return n
"""
)

# Move a refused (undecodable) leased entry aside. ARGV: K, boost, id, worker, reason
REJECT = (
    "local ARGV_BOOST = ARGV[2]\n"
    + _MAKE_READY
    + r"""
local K, id = ARGV[1], ARGV[3]
local payload = redis.call('HGET', K .. ':data', id) or id
redis.call('HSET', K .. ':rejected', id, payload)
forget(K, id)
redis.call('ZREM', K .. ':inflight', id)
return 1
"""
)

# {ready, delayed, inflight} in one round trip. ARGV: K
COUNTS = r"""
local K = ARGV[1]
return {redis.call('ZCARD', K), redis.call('ZCARD', K .. ':delayed'), redis.call('ZCARD', K .. ':inflight')}
"""
