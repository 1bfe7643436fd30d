-- Takes a shard's pending view deltas into an in-flight batch, the first step of a flush.
--
-- KEYS[1]  shard's pending deltas   hash article -> views not yet in SQL
-- KEYS[2]  shard's in-flight batch  hash: 'batch' -> id, 'lease' -> ms (Redis clock), article -> views
-- ARGV[1]  id for a new batch
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  most articles one batch may take
--
-- Returns { status, batch id, article, views, article, views, ... } where status is
--   'taken'   a new batch was recorded from pending
--   'redrive' an earlier batch whose lease ran out (its flusher died or stalled): flush it again
--   'busy'    another flusher holds the shard's batch
--   'empty'   nothing to flush
-- Pending is not decremented here: the taken views stay counted in every total until the clear
-- step, which subtracts exactly what was committed to SQL.

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local lease_until = now_ms + tonumber(ARGV[2])

local function batch_reply(status)
  local reply = { status, redis.call('HGET', KEYS[2], 'batch') }
  local fields = redis.call('HGETALL', KEYS[2])
  for i = 1, #fields, 2 do
    if fields[i] ~= 'batch' and fields[i] ~= 'lease' then
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
  return batch_reply('redrive')
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
redis.call('HSET', KEYS[2], 'batch', ARGV[1], 'lease', lease_until)
return batch_reply('taken')
