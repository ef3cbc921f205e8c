-- The crawl's workers, in shard 0's hash tag. KEYS: live (zset: worker -> when it counts as
-- dead, refreshed by its liveness thread), busy (set: workers with work of their own that may
-- not be in the queue yet: start requests, buffered writes, leases), epoch (string: +1 each time
-- a worker turns busy).
-- ARGV: op, now, worker, then
--   'state' busy(1/0) until -> epoch    (the worker's round: after its writes and pops)
--   'look'              -> {epoch, busy live others, {dead workers}}
--   'forget' dead...    -> 0            (once their leases were handed back on every shard)
--   'leave'             -> 0            (a clean close)
local LIVE, BUSY, EPOCH = KEYS[1], KEYS[2], KEYS[3]
local op, now, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if op == 'state' then
  redis.call('ZADD', LIVE, ARGV[5], worker)
  if ARGV[4] == '1' then
    if redis.call('SADD', BUSY, worker) == 1 then redis.call('INCR', EPOCH) end
  else
    redis.call('SREM', BUSY, worker)
  end
  return tonumber(redis.call('GET', EPOCH) or '0')
elseif op == 'look' then
  local busy = 0
  for _, w in ipairs(redis.call('SMEMBERS', BUSY)) do
    local until_ = tonumber(redis.call('ZSCORE', LIVE, w) or '0')
    if w ~= worker and until_ > now then busy = busy + 1 end
  end
  local dead = redis.call('ZRANGEBYSCORE', LIVE, '-inf', now, 'LIMIT', 0, 100)
  return {tonumber(redis.call('GET', EPOCH) or '0'), busy, dead}
elseif op == 'forget' then
  for i = 4, #ARGV do
    local until_ = tonumber(redis.call('ZSCORE', LIVE, ARGV[i]) or '0')
    if until_ <= now then
      redis.call('ZREM', LIVE, ARGV[i])
      redis.call('SREM', BUSY, ARGV[i])
    end
  end
  return 0
elseif op == 'leave' then
  redis.call('ZREM', LIVE, worker)
  redis.call('SREM', BUSY, worker)
  return 0
end
return redis.error_reply('workers.lua: unknown op ' .. tostring(op))
