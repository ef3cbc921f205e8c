-- ARGV: boost, worker, id1, id2, ... -> number removed
-- (runs after the shared queue.lua, see __init__.py)
local n = 0
for i = 3, #ARGV do n = n + ack(ARGV[i], ARGV[2], tonumber(ARGV[1])) end
return n
