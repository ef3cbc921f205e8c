-- Give leases back at once. ARGV: boost, worker, max_releases (-1: not counted), id1, ...
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
