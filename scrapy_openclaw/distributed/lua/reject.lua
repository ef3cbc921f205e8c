-- Move a refused (undecodable) leased entry aside. ARGV: boost, id, worker, reason
-- (runs after the shared queue.lua, see __init__.py)
local id = ARGV[2]
local payload = payload_of(id) or id
redis.call('HSET', REJ, id, payload)
forget(id, tonumber(ARGV[1]))
return 1
