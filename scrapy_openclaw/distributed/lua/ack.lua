-- ARGV: boost, worker, ack1, ack2, ... (an id, or "<id>\1<place>": see ack() in queue.lua)
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
