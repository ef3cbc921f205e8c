-- Hand back the leases of dead workers at once (they stopped answering; see workers.lua).
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
