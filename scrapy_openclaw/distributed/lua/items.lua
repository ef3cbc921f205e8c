-- Items of finished pages, written once each (``distributed/items.py``).
-- KEYS: the items list, the hash of pages whose items are written (same slot: see items.py)
-- ARGV: worker, n_forget, forget1..n, then per page: page id ("" for items of no page), n, item1..n
-- -> the page ids whose items were written before (by a worker that died before its ack): not again
-- A page's items and its mark go together; the mark is forgotten once its acknowledgement
-- counted (forget), so a page fetched again after a worker died is not written twice.
local list, marks = KEYS[1], KEYS[2]
local worker, n_forget = ARGV[1], tonumber(ARGV[2])
for first = 3, 2 + n_forget, 1000 do  -- (bounded: unpack's stack)
  redis.call('HDEL', marks, unpack(ARGV, first, math.min(first + 999, 2 + n_forget)))
end
local pages, at = {}, {}
local i = 3 + n_forget
while i <= #ARGV do
  local id, n = ARGV[i], tonumber(ARGV[i + 1])
  table.insert(pages, {id, i + 2, n})
  if id ~= '' then table.insert(at, id) end
  i = i + 2 + n
end
local written = {}
for first = 1, #at, 1000 do
  local chunk = {unpack(at, first, math.min(first + 999, #at))}
  local seen = redis.call('HMGET', marks, unpack(chunk))
  for j, id in ipairs(chunk) do
    if seen[j] then written[id] = true end
  end
end
local again, items, fresh = {}, {}, {}
for _, page in ipairs(pages) do
  local id, from, n = page[1], page[2], page[3]
  if written[id] then
    table.insert(again, id)
  else
    if id ~= '' then
      table.insert(fresh, id)
      table.insert(fresh, worker)
      written[id] = true  -- (one page twice in one call: once)
    end
    for j = from, from + n - 1 do table.insert(items, ARGV[j]) end
  end
end
for first = 1, #fresh, 1000 do
  redis.call('HSET', marks, unpack(fresh, first, math.min(first + 999, #fresh)))
end
for first = 1, #items, 1000 do
  redis.call('RPUSH', list, unpack(items, first, math.min(first + 999, #items)))
end
return again
