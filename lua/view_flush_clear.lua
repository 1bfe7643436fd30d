-- Finishes a flush once its batch is committed to SQL: subtracts exactly what was committed from
-- the pending deltas (never resets them: views counted meanwhile stay pending) and records the new
-- SQL counts as the base, in one step, so base + pending never double counts nor drops a view.
--
-- KEYS[1]  shard's pending deltas   hash article -> views not yet in SQL
-- KEYS[2]  shard's in-flight batch  hash: 'batch', 'lease', 'seq', article -> views
-- KEYS[3]  shard's base counts      hash article -> view_count as SQL has it
-- KEYS[4]  shard's all-time ranking zset article -> views
-- ARGV[1]  the committed batch's id
-- ARGV[2..] pairs: article, its view_count in SQL after the commit ('' when the article is gone)
--
-- Returns 1 when cleared, 0 when the batch is no longer in flight (another flusher cleared it).

if redis.call('HGET', KEYS[2], 'batch') ~= ARGV[1] then
  return 0
end

local fields = redis.call('HGETALL', KEYS[2])
for i = 1, #fields, 2 do
  local article = fields[i]
  if article ~= 'batch' and article ~= 'lease' and article ~= 'seq' then
    local left = redis.call('HINCRBY', KEYS[1], article, -tonumber(fields[i + 1]))
    if left <= 0 then
      redis.call('HDEL', KEYS[1], article)
    end
  end
end

for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[3], ARGV[i])
    redis.call('ZREM', KEYS[4], ARGV[i])
  else
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  end
end

redis.call('DEL', KEYS[2])
return 1
