-- Takes a shard's pending view deltas into an in-flight batch, the first step of a flush.
--
-- KEYS[1]  shard's pending deltas   hash article -> views not yet in SQL
-- KEYS[2]  shard's in-flight batch  hash: 'batch' -> id, 'lease' -> ms (Redis clock), 'seq' -> the
--                                   batch's flush sequence, article -> views
-- KEYS[3]  shard's flush sequence   string: the sequence of the shard's last taken batch
-- ARGV[1]  id for a new batch
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  most articles one batch may take
-- ARGV[4]  the sequence of the shard's last batch committed to SQL
--
-- Returns { status, batch id, batch sequence, article, views, article, views, ... } where status is
--   'taken'   a new batch was recorded from pending, with the next sequence
--   'redrive' an earlier batch whose lease ran out (its flusher died or stalled): flush it again
-- or { status, ... } where status is
--   'busy'    another flusher holds the shard's batch
--   'empty'   nothing to flush
--   'behind'  followed by the shard's sequence in Redis: SQL has committed batches this Redis never
--             took (it came back from an older snapshot, AOF or replica), so its pending deltas may
--             hold views SQL already has; nothing is taken until the caller repairs the shard.
-- Pending is not decremented here: the taken views stay counted in every total until the clear
-- step, which subtracts exactly what was committed to SQL.

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease_until = now_ms + tonumber(ARGV[2])
local redis_seq = tonumber(redis.call('GET', KEYS[3]) or '0')

local function batch_reply(status)
  local reply = { status, redis.call('HGET', KEYS[2], 'batch'), redis.call('HGET', KEYS[2], 'seq') }
  local fields = redis.call('HGETALL', KEYS[2])
  for i = 1, #fields, 2 do
    if fields[i] ~= 'batch' and fields[i] ~= 'lease' and fields[i] ~= 'seq' then
      reply[#reply + 1] = fields[i]
      reply[#reply + 1] = fields[i + 1]
    end
  end
  return reply
end

if redis.call('EXISTS', KEYS[2]) == 1 then
  if tonumber(redis.call('HGET', KEYS[2], 'lease') or '0') > now_ms then
    return { 'busy' }
  end
  redis.call('HSET', KEYS[2], 'lease', lease_until)
  -- A batch taken before flush sequences existed gets the next one now.
  if not redis.call('HGET', KEYS[2], 'seq') then
    redis.call('HSET', KEYS[2], 'seq', redis_seq + 1)
    redis.call('SET', KEYS[3], redis_seq + 1)
  end
  return batch_reply('redrive')
end

if redis_seq < tonumber(ARGV[4]) then
  return { 'behind', tostring(redis_seq) }
end

local pending = redis.call('HGETALL', KEYS[1])
local limit = tonumber(ARGV[3])
local taken = 0
for i = 1, #pending, 2 do
  if taken >= limit then
    break
  end
  local views = tonumber(pending[i + 1])
  if views > 0 then
    redis.call('HSET', KEYS[2], pending[i], views)
    taken = taken + 1
  end
end
if taken == 0 then
  return { 'empty' }
end
redis.call('HSET', KEYS[2], 'batch', ARGV[1], 'lease', lease_until, 'seq', redis_seq + 1)
redis.call('SET', KEYS[3], redis_seq + 1)
return batch_reply('taken')
