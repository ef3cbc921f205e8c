-- KEYS: the shard's 16 keys (SEEN: the shard's part of the dupefilter).
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
