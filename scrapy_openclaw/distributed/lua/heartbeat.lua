-- Extend this worker's leases and requeue everyone's expired ones.
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
