-- KEYS: the shard's 16 keys (SEEN: the shard's part of the dupefilter).
-- ARGV: boost, id, payload, info_json, not_before, now, ack_id, worker, fingerprint ('' = unchecked),
--       copy (1: a retry or redirect copy of a leased request, 0: a request discovered now)
-- Returns 1 when queued, 0 when the fingerprint was already seen. FOUND counts the discovered ones
-- (the progress line's "discovered": a copy is the same request again).
-- The dupefilter mark and the push are one step: marked-but-not-queued (a worker
-- killed between two round trips) would filter the page for good, since the
-- parent's re-fetch finds its child "seen". A filtered copy still acknowledges
-- ack_id (a redirect to a seen URL finishes the original request); ack_id is
-- only given when the original lives in the same shard (same domain).
-- (runs after the shared queue.lua, see __init__.py)
local boost, id, now = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[6])
if ARGV[9] ~= '' and redis.call('SADD', SEEN, ARGV[9]) == 0 then
  if ARGV[7] ~= '' then ack(ARGV[7], ARGV[8], boost) end
  return 0
end
redis.call('HSET', DATA, id, ARGV[3])
if ARGV[10] ~= '1' then redis.call('INCR', FOUND) end
redis.call('HSET', INFO, id, ARGV[4])
local nb = tonumber(ARGV[5])
if nb > now then
  redis.call('ZADD', DELAYED, nb, id)
else
  make_ready(id, boost)
end
if ARGV[7] ~= '' then ack(ARGV[7], ARGV[8], boost) end
return 1
